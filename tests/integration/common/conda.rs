//! Conda-layout fixtures: prefixes laid out as `conda create` makes them
//! (`bin/python`, `lib/pythonX.Y/` with its own `site-packages`,
//! `conda-meta/history`, `etc/conda/activate.d/`), a Conda root with
//! `envs/`, `~/.conda/environments.txt`, and a fake `conda` executable that
//! answers `info --json`, `env list --json` and `install` like the real one.
//!
//! Nothing here touches the test process's own environment: discovery gets
//! its PATH, HOME and CONDA_* through [`CondaFixture::host_env`].

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use code_executor::config::HostEnv;

/// A real interpreter a fixture prefix can copy.
#[derive(Debug, Clone)]
pub struct Interpreter {
    /// The binary itself (symlinks resolved).
    pub binary: PathBuf,
    /// Its standard library folder (`.../lib/pythonX.Y`).
    pub stdlib: PathBuf,
    /// `X.Y`
    pub short_version: String,
    /// `X.Y.Z`
    pub version: String,
}

impl Interpreter {
    fn probe(python: &Path) -> Interpreter {
        let out = Command::new(python)
            .args([
                "-I",
                "-c",
                "import os, sys, sysconfig, platform; \
                 print(os.path.realpath(sys.executable)); \
                 print(sysconfig.get_paths()['stdlib']); \
                 print('%d.%d' % sys.version_info[:2]); \
                 print(platform.python_version())",
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
        assert!(out.status.success(), "{} failed: {out:?}", python.display());
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        Interpreter {
            binary: PathBuf::from(lines[0]),
            stdlib: PathBuf::from(lines[1]),
            short_version: lines[2].to_string(),
            version: lines[3].to_string(),
        }
    }

    /// The interpreter behind `python3` on PATH (pyenv's 3.11.7 here).
    pub fn primary() -> &'static Interpreter {
        static I: OnceLock<Interpreter> = OnceLock::new();
        I.get_or_init(|| Interpreter::probe(&super::python()))
    }

    /// A second, different interpreter: Debian's `/usr/bin/python3` (its
    /// libpython is linked in, so a copy runs anywhere). The tests that
    /// need two interpreters fail loudly when it is missing.
    pub fn secondary() -> &'static Interpreter {
        static I: OnceLock<Interpreter> = OnceLock::new();
        I.get_or_init(|| {
            let system = Path::new("/usr/bin/python3");
            assert!(
                system.exists(),
                "the two-interpreter tests need /usr/bin/python3 (apt-get install python3)"
            );
            let i = Interpreter::probe(system);
            assert_ne!(
                i.binary,
                Interpreter::primary().binary,
                "/usr/bin/python3 must differ from python3 on PATH"
            );
            i
        })
    }
}

/// A Conda installation in a temporary directory: root prefix (`base`),
/// `envs/`, a home with `.conda/environments.txt`, and a `bin/` folder with
/// the fake `conda`.
pub struct CondaFixture {
    pub dir: tempfile::TempDir,
    /// The root prefix (`base`).
    pub root: PathBuf,
    /// `HOME` for discovery.
    pub home: PathBuf,
    /// Folder holding the fake `conda` (the only entry of the test PATH).
    pub bin: PathBuf,
    /// Every `conda` invocation's arguments, one line each.
    pub log: PathBuf,
    /// Prefixes `conda env list` reports, besides the root's `envs/`.
    extra: Vec<PathBuf>,
}

impl CondaFixture {
    /// A Conda root running `interpreter`, with no other env and no fake
    /// `conda` yet (see [`CondaFixture::install_fake_conda`]).
    pub fn new(interpreter: &Interpreter) -> CondaFixture {
        let dir = tempfile::Builder::new()
            .prefix("conda-fixture-")
            .tempdir()
            .unwrap();
        let base = dir.path().canonicalize().unwrap();
        let root = base.join("miniforge3");
        create_prefix(&root, interpreter);
        std::fs::create_dir_all(root.join("condabin")).unwrap();
        std::fs::create_dir_all(root.join("envs")).unwrap();
        let home = base.join("home");
        std::fs::create_dir_all(home.join(".conda")).unwrap();
        let bin = base.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        CondaFixture {
            log: base.join("conda.log"),
            dir,
            root,
            home,
            bin,
            extra: Vec::new(),
        }
    }

    /// `conda create -n NAME`: a prefix under the root's `envs/`.
    pub fn create_env(&mut self, name: &str, interpreter: &Interpreter) -> PathBuf {
        let prefix = self.root.join("envs").join(name);
        create_prefix(&prefix, interpreter);
        self.rewrite_fake_conda();
        prefix
    }

    /// `conda create -p PATH`: a prefix outside the root, recorded in
    /// `~/.conda/environments.txt` as Conda does.
    pub fn create_env_at(&mut self, path: &Path, interpreter: &Interpreter) -> PathBuf {
        create_prefix(path, interpreter);
        let prefix = path.canonicalize().unwrap();
        self.extra.push(prefix.clone());
        let mut listed: Vec<String> = vec![self.root.display().to_string()];
        listed.extend(self.extra.iter().map(|p| p.display().to_string()));
        std::fs::write(
            self.home.join(".conda/environments.txt"),
            listed.join("\n") + "\n",
        )
        .unwrap();
        self.rewrite_fake_conda();
        prefix
    }

    /// Put a fake `conda` into [`CondaFixture::bin`].
    pub fn install_fake_conda(&mut self) {
        self.rewrite_fake_conda_at(true);
    }

    fn rewrite_fake_conda(&mut self) {
        self.rewrite_fake_conda_at(false);
    }

    fn rewrite_fake_conda_at(&mut self, create: bool) {
        let exe = self.bin.join("conda");
        if !create && !exe.exists() {
            return;
        }
        let mut envs = vec![self.root.clone()];
        if let Ok(entries) = std::fs::read_dir(self.root.join("envs")) {
            let mut named: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            named.sort();
            envs.extend(named);
        }
        envs.extend(self.extra.iter().cloned());
        let envs_json = serde_json::to_string(&envs).unwrap();
        let info = serde_json::json!({
            "active_prefix": null,
            "conda_version": "24.1.2",
            "root_prefix": self.root,
            "envs_dirs": [self.root.join("envs"), self.home.join(".conda/envs")],
            "envs": envs,
            "platform": "linux-64",
        });
        let script = format!(
            r#"#!/bin/sh
# A stand-in for conda: answers what code-executor asks.
printf '%s\n' "$*" >> '{log}'
# A prefix laid out as conda create makes it: the root's interpreter,
# standard library links and package records, a history.
lay_out() {{
  mkdir -p "$1/conda-meta" || exit 1
  cp -RP '{root}/bin' '{root}/lib' "$1/" || exit 1
  cp '{root}'/conda-meta/*.json "$1/conda-meta/" || exit 1
  printf '==> 2024-01-01 00:00:00 <==\n# cmd: conda create -p %s\n' "$1" > "$1/conda-meta/history"
}}
case "$1" in
  info)
    [ "$2" = "--json" ] || {{ echo "fake conda: only info --json" >&2; exit 2; }}
    cat <<'JSON'
{info}
JSON
    ;;
  env)
    if [ "$2" = "create" ]; then
      # env create -p PREFIX -f FILE
      shift 2
      prefix=; file=
      while [ $# -gt 0 ]; do
        case "$1" in
          -p) shift; prefix=$1 ;;
          -f) shift; file=$1 ;;
          *) echo "fake conda: unexpected argument $1" >&2; exit 2 ;;
        esac
        shift
      done
      lay_out "$prefix"
      cp "$file" "$prefix/conda-meta/environment.yml"
      if grep -q 'fail' "$file"; then echo "fake conda: ResolvePackageNotFound: fail" >&2; exit 1; fi
      echo "created $prefix from $file"
      exit 0
    fi
    [ "$2 $3" = "list --json" ] || {{ echo "fake conda: only env list --json and env create" >&2; exit 2; }}
    cat <<'JSON'
{{"envs": {envs_json}}}
JSON
    ;;
  create)
    # create -y -p PREFIX (SPECS... | --clone SOURCE)
    shift
    prefix=; clone=; specs=
    while [ $# -gt 0 ]; do
      case "$1" in
        -y) ;;
        -p) shift; prefix=$1 ;;
        --clone) shift; clone=$1 ;;
        -*) echo "fake conda: unexpected option $1" >&2; exit 2 ;;
        *) specs="$specs $1" ;;
      esac
      shift
    done
    lay_out "$prefix"
    for spec in $specs; do
      name=${{spec%%[=<>]*}}
      case "$name" in fail*) echo "fake conda: PackagesNotFoundError: $spec" >&2; exit 1 ;; esac
      printf '{{"name": "%s", "version": "1.0", "build": "0"}}\n' "$name" > "$prefix/conda-meta/$name-1.0-0.json"
    done
    echo "created $prefix"
    ;;
  install)
    shift
    prefix=
    while [ $# -gt 0 ]; do
      case "$1" in
        -y) ;;
        -p) shift; prefix=$1 ;;
        -*) echo "fake conda: unexpected option $1" >&2; exit 2 ;;
        *) name=${{1%%[=<>]*}}
           # A slow package keeps the install running, for races.
           case "$name" in slow*) sleep 1 ;; esac
           printf '{{"name": "%s", "version": "1.0", "build": "0"}}\n' "$name" > "$prefix/conda-meta/$name-1.0-0.json"
           # A package with an activation script, as e.g. openjdk has.
           if [ "$name" = activator ]; then
             mkdir -p "$prefix/etc/conda/activate.d" || exit 1
             printf 'export ACTIVATOR=installed\n' > "$prefix/etc/conda/activate.d/activator.sh" || exit 1
           fi
           echo "installed $name 1.0" ;;
      esac
      shift
    done
    ;;
  *) echo "fake conda: unknown command $1" >&2; exit 2 ;;
esac
"#,
            log = self.log.display(),
            root = self.root.display(),
            info = info,
        );
        std::fs::write(&exe, script).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// PATH = the fixture's `bin/` only; HOME = the fixture's home; no
    /// CONDA_EXE, no active env, no install folders such as `/opt`, no
    /// variables choosing an env and no config files.
    pub fn host_env(&self) -> HostEnv {
        HostEnv {
            path: Some(self.bin.clone().into_os_string()),
            home: Some(self.home.clone()),
            ..HostEnv::default()
        }
    }

    /// The lines the fake `conda` logged.
    pub fn conda_calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// Lay out a Conda prefix running a copy of `interpreter`: `bin/python`,
/// `lib/pythonX.Y/` (stdlib entries linked, an empty `site-packages` of its
/// own), `conda-meta/history` and a `python` package record. There is no
/// `pyvenv.cfg`, so the copy's `sys.prefix` is the prefix itself.
pub fn create_prefix(prefix: &Path, interpreter: &Interpreter) {
    let bin = prefix.join("bin");
    let lib = prefix
        .join("lib")
        .join(format!("python{}", interpreter.short_version));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(lib.join("site-packages")).unwrap();
    std::fs::create_dir_all(prefix.join("conda-meta")).unwrap();
    std::fs::copy(&interpreter.binary, bin.join("python")).unwrap();
    std::os::unix::fs::symlink("python", bin.join("python3")).unwrap();
    for entry in std::fs::read_dir(&interpreter.stdlib).unwrap().flatten() {
        let name = entry.file_name();
        let skip = [
            "site-packages",
            "dist-packages",
            "EXTERNALLY-MANAGED",
            "__pycache__",
        ];
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), lib.join(&name)).unwrap();
    }
    std::fs::write(
        prefix.join("conda-meta/history"),
        format!(
            "==> 2024-01-01 00:00:00 <==\n# cmd: conda create -p {}\n",
            prefix.display()
        ),
    )
    .unwrap();
    std::fs::write(
        prefix.join(format!(
            "conda-meta/python-{}-h0_0.json",
            interpreter.version
        )),
        format!(
            r#"{{"name": "python", "version": "{}", "build": "h0_0"}}"#,
            interpreter.version
        ),
    )
    .unwrap();
}

/// Add `etc/conda/activate.d/NAME` to a prefix.
pub fn add_activate_script(prefix: &Path, name: &str, body: &str) {
    let dir = prefix.join("etc/conda/activate.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), body).unwrap();
}

/// The `site-packages` of a fixture prefix.
pub fn site_packages(prefix: &Path, interpreter: &Interpreter) -> PathBuf {
    prefix
        .join("lib")
        .join(format!("python{}", interpreter.short_version))
        .join("site-packages")
}

/// Make pip importable in a fixture prefix by linking the primary
/// interpreter's own pip into its `site-packages` (offline, instant).
pub fn link_pip(prefix: &Path, interpreter: &Interpreter) {
    let from = interpreter.stdlib.join("site-packages");
    let to = site_packages(prefix, interpreter);
    let mut linked = 0;
    for entry in std::fs::read_dir(&from).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "pip" || (name.starts_with("pip-") && name.ends_with(".dist-info")) {
            std::os::unix::fs::symlink(entry.path(), to.join(&name)).unwrap();
            linked += 1;
        }
    }
    assert_eq!(linked, 2, "pip not found in {}", from.display());
}

/// Write a minimal pure-Python wheel `NAME-VERSION-py3-none-any.whl` into
/// `dir` whose package `NAME` has `VALUE = value`; returns its path.
pub fn build_wheel(dir: &Path, name: &str, version: &str, value: &str) -> PathBuf {
    let wheel = dir.join(format!("{name}-{version}-py3-none-any.whl"));
    let script = r#"
import base64, hashlib, sys, zipfile
wheel, name, version, value = sys.argv[1:5]
info = "%s-%s.dist-info" % (name, version)
files = {
    name + "/__init__.py": "VALUE = %s\n" % value,
    info + "/METADATA": "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version),
    info + "/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile(wheel, "w") as z:
    for path, text in files.items():
        data = text.encode()
        z.writestr(path, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    record.append(info + "/RECORD,,")
    z.writestr(info + "/RECORD", "\n".join(record) + "\n")
"#;
    let out = Command::new(super::python())
        .args(["-I", "-c", script])
        .arg(&wheel)
        .args([name, version, value])
        .output()
        .unwrap();
    assert!(out.status.success(), "wheel build failed: {out:?}");
    wheel
}
