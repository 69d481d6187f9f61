//! deploy/kubernetes/: the manifests validate against the Kubernetes schemas
//! offline (`kubernetes-validate`, installed into a venv by the test setup),
//! every container meets the restricted Pod Security Standard, the objects
//! point at each other, and the probes and the metrics scrape mean what they
//! say against a real server.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::common::{self, TestServer};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The YAML documents of a manifest file, as JSON values.
fn documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo(path)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("valid YAML document"))
        .collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the manifests"))
}

/// The first container's env entry `name`.
fn env_entry<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {container}"))
}

#[tokio::test]
async fn the_manifests_validate_against_the_kubernetes_schemas_offline() {
    let validate = common::pyenvs::kubernetes_validate().await;
    let manifest = repo("deploy/kubernetes/code-executor.yaml");
    // The oldest and the newest Kubernetes the package has schemas for.
    for version in ["1.25.0", "1.37.0"] {
        let out = std::process::Command::new(&validate)
            .args(["--strict", "-k", version])
            .arg(&manifest)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{version}:\n{text}");
        // Every object was checked against a schema: no "couldn't find schema".
        assert!(
            !text.contains("WARN") && !text.contains("ERROR"),
            "{version}:\n{text}"
        );
        for resource in [
            "deployment/code-executor",
            "service/code-executor",
            "horizontalpodautoscaler/code-executor",
            "poddisruptionbudget/code-executor",
            "networkpolicy/code-executor-deny-egress",
        ] {
            assert!(
                text.contains(&format!("passed for resource {resource}")),
                "{resource} not validated against {version}:\n{text}"
            );
        }
    }
    // The routing and the custom-metric autoscaler, against the same schemas.
    for (file, resources) in [
        (
            "deploy/kubernetes/routing.yaml",
            &["ingress/code-executor", "service/code-executor-replicas"][..],
        ),
        (
            "deploy/kubernetes/autoscaling-custom-metrics.yaml",
            &["horizontalpodautoscaler/code-executor"][..],
        ),
    ] {
        for version in ["1.25.0", "1.37.0"] {
            let out = std::process::Command::new(&validate)
                .args(["--strict", "-k", version])
                .arg(repo(file))
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{file} {version}:\n{text}");
            assert!(
                !text.contains("WARN") && !text.contains("ERROR"),
                "{file} {version}:\n{text}"
            );
            for resource in resources {
                assert!(
                    text.contains(&format!("passed for resource {resource}")),
                    "{resource} of {file} not validated against {version}:\n{text}"
                );
            }
        }
    }
    // And the validator does catch a misspelt field.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &broken,
        text.replace("readOnlyRootFilesystem", "readOnlyRootFilesytem"),
    )
    .unwrap();
    let out = std::process::Command::new(&validate)
        .arg("--strict")
        .arg(&broken)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("readOnlyRootFilesytem"), "{text}");
}

#[test]
fn every_container_meets_the_restricted_pod_security_standard() {
    let docs = documents("deploy/kubernetes/code-executor.yaml");
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Deployment",
            "Service",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
            "NetworkPolicy"
        ]
    );
    let pod = &kind(&docs, "Deployment")["spec"]["template"]["spec"];
    // Pod level.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{pod}");
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert!(pod["securityContext"]["runAsUser"].as_u64().unwrap() > 0);
    for forbidden in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(
            pod[forbidden].is_null() || pod[forbidden] == false,
            "{forbidden}"
        );
    }
    let volumes = pod["volumes"].as_array().unwrap();
    for volume in volumes {
        assert!(volume["hostPath"].is_null(), "{volume}");
    }
    // Every container, init containers included.
    let containers: Vec<&Value> = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .filter_map(|k| pod[*k].as_array())
        .flatten()
        .collect();
    assert!(!containers.is_empty());
    for c in containers {
        let name = &c["name"];
        let sc = &c["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{name}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{name}"
        );
        assert!(sc["capabilities"]["add"].is_null(), "{name}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
        assert!(
            sc["privileged"].is_null() || sc["privileged"] == false,
            "{name}"
        );
        assert!(sc["runAsUser"].is_null() || sc["runAsUser"].as_u64() > Some(0));
        // Scratch on an emptyDir at /tmp, the only writable place.
        let tmp = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == "/tmp")
            .unwrap_or_else(|| panic!("{name}: no /tmp mount"));
        let volume = volumes.iter().find(|v| v["name"] == tmp["name"]).unwrap();
        assert!(volume["emptyDir"].is_object(), "{volume}");
        assert!(
            c["resources"]["requests"]["cpu"].is_string(),
            "the HPA needs a CPU request"
        );
    }
    assert_eq!(pod["automountServiceAccountToken"], false);
}

#[test]
fn the_objects_point_at_each_other_and_egress_is_denied() {
    let docs = documents("deploy/kubernetes/code-executor.yaml");
    let deployment = kind(&docs, "Deployment");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(deployment["spec"]["selector"]["matchLabels"], *labels);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let service = kind(&docs, "Service");
    assert_eq!(service["spec"]["selector"], *labels);
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"],
        container["ports"][0]["name"]
    );
    let hpa = kind(&docs, "HorizontalPodAutoscaler");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        deployment["metadata"]["name"]
    );
    assert_eq!(hpa["spec"]["metrics"][0]["resource"]["name"], "cpu");
    assert!(
        hpa["spec"]["minReplicas"].as_u64() >= Some(2),
        "one pod may be disrupted"
    );
    let pdb = kind(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], *labels);
    let policy = kind(&docs, "NetworkPolicy");
    assert_eq!(policy["spec"]["podSelector"]["matchLabels"], *labels);
    assert_eq!(policy["spec"]["policyTypes"], serde_json::json!(["Egress"]));
    assert_eq!(
        policy["spec"]["egress"],
        serde_json::json!([]),
        "no egress rule: all denied"
    );
    // The token comes from a Secret; pods never generate their own.
    let token = env_entry(container, "CODE_EXECUTOR_TOKEN");
    assert_eq!(token["valueFrom"]["secretKeyRef"]["key"], "token");
    let text = std::fs::read_to_string(repo("deploy/kubernetes/code-executor.yaml")).unwrap();
    assert!(
        text.to_lowercase().contains("session") && text.contains("sessionAffinity"),
        "the scaling note mentions session affinity"
    );
}

#[test]
fn prometheus_scrapes_metrics_with_the_metrics_token_of_the_secret() {
    let docs = documents("deploy/kubernetes/code-executor.yaml");
    let deployment = kind(&docs, "Deployment");
    let template = &deployment["spec"]["template"];
    // An annotation cannot carry a bearer token: none that would fail.
    assert!(
        template["metadata"]["annotations"]["prometheus.io/scrape"].is_null(),
        "{template}"
    );
    let container = &template["spec"]["containers"][0];
    let secret = &env_entry(container, "CODE_EXECUTOR_METRICS_TOKEN")["valueFrom"]["secretKeyRef"];
    let monitors = documents("deploy/kubernetes/servicemonitor.yaml");
    let monitor = kind(&monitors, "ServiceMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    let service = kind(&docs, "Service");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        service["metadata"]["labels"]
    );
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["authorization"]["type"], "Bearer");
    assert_eq!(
        endpoint["authorization"]["credentials"]["name"],
        secret["name"]
    );
    assert_eq!(
        endpoint["authorization"]["credentials"]["key"],
        secret["key"]
    );
}

#[tokio::test]
async fn the_probes_and_the_scrape_mean_what_they_say_against_a_real_server() {
    let docs = documents("deploy/kubernetes/code-executor.yaml");
    let container = &kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    let path = |probe: &str| {
        container[probe]["httpGet"]["path"]
            .as_str()
            .unwrap_or_else(|| panic!("no {probe}"))
            .to_string()
    };
    let (startup, readiness, liveness) = (
        path("startupProbe"),
        path("readinessProbe"),
        path("livenessProbe"),
    );
    assert_eq!(readiness, "/health");
    assert_ne!(
        liveness, "/health",
        "/health is readiness: 503 when no env can serve"
    );
    let server = TestServer::with_config(code_executor::Config {
        pool_size: 1,
        token: Some("api-token".into()),
        metrics_token: Some("metrics-token".into()),
        ..common::config()
    })
    .await;
    // Kubelet probes carry no token.
    let probe = |path: String| {
        let url = format!("{}{path}", server.url);
        async move {
            reqwest::Client::new()
                .get(url)
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(probe(startup.clone()).await, 200);
    assert_eq!(probe(readiness.clone()).await, 200);
    assert_eq!(probe(liveness.clone()).await, 200);
    // Prometheus with the metrics token scrapes; without it, or with the
    // API token's place taken by it, not.
    let (status, text) = crate::ops::scrape(&server, Some("metrics-token")).await;
    assert_eq!(status, 200);
    assert!(text.contains("code_executor_runs_total"), "{text}");
    let (status, _) = crate::ops::scrape(&server, None).await;
    assert_eq!(status, 401);
    // Not ready (shutting down: no env serves) is not dead: readiness
    // fails, liveness does not.
    server.executor.shutdown().await;
    assert_eq!(probe(readiness).await, 503);
    assert_eq!(probe(liveness.clone()).await, 200);
    let resp = reqwest::get(format!("{}{liveness}", server.url))
        .await
        .unwrap();
    assert_eq!(resp.text().await.unwrap(), "ok\n");
    server.stop().await;
}

#[test]
fn the_routing_pins_sessions_by_the_cookie_haproxy_uses_and_reaches_every_ready_pod() {
    let base = documents("deploy/kubernetes/code-executor.yaml");
    let deployment = kind(&base, "Deployment");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let service = kind(&base, "Service");
    let routing = documents("deploy/kubernetes/routing.yaml");
    let ingress = kind(&routing, "Ingress");
    let notes = &ingress["metadata"]["annotations"];
    assert_eq!(notes["nginx.ingress.kubernetes.io/affinity"], "cookie");
    // balanced (the default) moves pinned clients on scale-up.
    assert_eq!(
        notes["nginx.ingress.kubernetes.io/affinity-mode"],
        "persistent"
    );
    let cookie = notes["nginx.ingress.kubernetes.io/session-cookie-name"]
        .as_str()
        .unwrap();
    assert_eq!(cookie, crate::common::cluster::AFFINITY_COOKIE);
    let haproxy = std::fs::read_to_string(repo("deploy/haproxy/haproxy.cfg")).unwrap();
    assert!(
        haproxy.contains(&format!("cookie {cookie} insert indirect nocache")),
        "HAProxy and the Ingress pin with the same cookie"
    );
    // Streams unbuffered, and the longest run (max_timeout 300 s) fits.
    assert_eq!(notes["nginx.ingress.kubernetes.io/proxy-buffering"], "off");
    let read: u64 = notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(read > 300, "{read}");
    let backend = &ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"];
    assert_eq!(backend["name"], service["metadata"]["name"]);
    assert_eq!(backend["port"]["name"], service["spec"]["ports"][0]["name"]);
    // The headless Service lists the ready pods only, by their own port.
    let headless = kind(&routing, "Service");
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], false);
    assert_eq!(headless["spec"]["selector"], *labels);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        headless["spec"]["ports"][0]["targetPort"],
        container["ports"][0]["name"]
    );
    // The pod drains before it stops, within its grace period.
    let delay: u64 = env_entry(container, "CODE_EXECUTOR_DRAIN_DELAY")["value"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    let shutdown = code_executor::Config::default().shutdown_timeout.as_secs();
    assert!(
        delay > 0 && grace > delay + shutdown,
        "grace {grace} s must cover the drain delay {delay} s and shutdown_timeout {shutdown} s"
    );
}

#[tokio::test]
async fn the_custom_metric_autoscaler_reads_metrics_the_server_exports() {
    let docs = documents("deploy/kubernetes/autoscaling-custom-metrics.yaml");
    let hpa = kind(&docs, "HorizontalPodAutoscaler");
    let base = documents("deploy/kubernetes/code-executor.yaml");
    assert_eq!(
        hpa["metadata"]["name"],
        kind(&base, "HorizontalPodAutoscaler")["metadata"]["name"],
        "it replaces the CPU HPA, never beside it"
    );
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        kind(&base, "Deployment")["metadata"]["name"]
    );
    let metric = &hpa["spec"]["metrics"][0]["pods"]["metric"]["name"];
    assert_eq!(metric, "code_executor_worker_demand");
    // The adapter rule (in the file's comment and in docs/scaling.md) makes
    // that metric from series a real server exports.
    let text =
        std::fs::read_to_string(repo("deploy/kubernetes/autoscaling-custom-metrics.yaml")).unwrap();
    let docs_text = std::fs::read_to_string(repo("docs/scaling.md")).unwrap();
    let server = TestServer::with_config(code_executor::Config {
        pool_size: 1,
        ..common::config()
    })
    .await;
    let (_, scraped) = crate::ops::scrape(&server, None).await;
    for series in [
        "code_executor_workers{",
        "code_executor_requests_waiting{",
        "code_executor_runs_total{",
        "code_executor_draining ",
        "code_executor_sessions ",
        "code_executor_replica_info{",
    ] {
        assert!(
            scraped.contains(series),
            "{series} not exported:\n{scraped}"
        );
    }
    for needed in [
        "as: code_executor_worker_demand",
        "code_executor_requests_waiting{<<.LabelMatchers>>}",
        "state=\"busy\"",
    ] {
        assert!(
            text.contains(needed),
            "{needed} missing from the adapter rule"
        );
        assert!(
            docs_text.contains(needed),
            "{needed} missing from docs/scaling.md"
        );
    }
    server.stop().await;
}
