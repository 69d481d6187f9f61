//! Artifacts over MCP: every file a run writes comes back as a
//! `resource_link`, is readable with `resources/read` (and over HTTP with the
//! same token) until it expires, plots are kept to a size, and what a model
//! reads never carries a 100k-character payload.

use std::time::Duration;

use code_executor::config::EnvChoice;
use rmcp::model::{ContentBlock, ReadResourceRequestParams, ResourceContents};
use serde_json::{Value, json};

use crate::common::mcp::{call, connect_http, text};
use crate::common::{self, TestServer, pyenvs};

const TOKEN: &str = "artifact-test-token";

async fn server(python: std::path::PathBuf) -> TestServer {
    let mut config = common::config();
    config.env = EnvChoice::Python(python);
    config.token = Some(TOKEN.into());
    config.artifacts.ttl = Duration::from_secs(3);
    config.max_image_pixels = 20_000;
    TestServer::with_config(config).await
}

fn blob(contents: &[ResourceContents]) -> (Vec<u8>, Option<String>) {
    match &contents[0] {
        ResourceContents::BlobResourceContents {
            blob, mime_type, ..
        } => (
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, blob).unwrap(),
            mime_type.clone(),
        ),
        other => panic!("not a blob: {other:?}"),
    }
}

/// Width and height of a PNG, from its IHDR chunk.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

#[tokio::test]
async fn a_plot_comes_back_as_a_link_readable_over_mcp_and_http() {
    let server = server(pyenvs::plot_python().await).await;
    let client = connect_http(&format!("{}/mcp", server.url), Some(TOKEN)).await;
    let out = call(
        &client,
        "execute_code",
        json!({"code": "import matplotlib.pyplot as plt\nplt.figure(figsize=(8, 6))\nplt.plot([1, 3, 2])\nplt.show()"}),
    )
    .await
    .unwrap();
    assert_ne!(out.is_error, Some(true), "{out:?}");
    let link = out
        .content
        .iter()
        .find_map(|c| match c {
            ContentBlock::ResourceLink(r) => Some(r.clone()),
            _ => None,
        })
        .expect("a resource_link");
    assert!(link.uri.starts_with("artifact://"), "{link:?}");
    assert_eq!(link.mime_type.as_deref(), Some("image/png"));
    // The text a model reads names it too.
    assert!(text(&out).contains(&link.uri), "{}", text(&out));
    let structured = out.structured_content.as_ref().unwrap();
    assert_eq!(structured["artifacts"][0]["uri"], link.uri.as_str());
    let read = client
        .read_resource(ReadResourceRequestParams::new(link.uri.clone()))
        .await
        .unwrap();
    let (png, mime) = blob(&read.contents);
    assert_eq!(mime.as_deref(), Some("image/png"));
    assert_eq!(png.len() as u64, link.size.unwrap());
    // 8 x 6 inches at the default 100 dpi would be 480,000 pixels: the
    // figure was saved within max_image_pixels.
    let (w, h) = png_size(&png);
    assert!(u64::from(w) * u64::from(h) <= 20_000, "{w} x {h}");
    assert!(w > 100 && h > 70, "{w} x {h}: the aspect ratio holds");
    let listed = client.list_all_resources().await.unwrap();
    assert!(listed.iter().any(|r| r.uri == link.uri), "{listed:?}");
    let templates = client.list_all_resource_templates().await.unwrap();
    assert_eq!(templates[0].uri_template, "artifact://{run}/{path}");
    // The same bytes over HTTP, with the same token; nobody else's.
    let (run, path) = link.uri["artifact://".len()..].split_once('/').unwrap();
    let url = format!("{}/artifacts/{run}/{path}", server.url);
    let resp = server
        .client
        .get(&url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "image/png");
    assert_eq!(resp.bytes().await.unwrap().as_ref(), png.as_slice());
    let resp = server.client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = server
        .client
        .get(format!("{}/artifacts/{run}/nothing.png", server.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    client.cancel().await.unwrap();
    server.stop().await;
}

/// [`connect_http`] with room for one large message: rmcp's client refuses
/// server-sent events over 16 MiB by default.
async fn connect_http_large(url: &str) -> crate::common::mcp::McpClient {
    use rmcp::ServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let config = StreamableHttpClientTransportConfig::with_uri(url)
        .auth_header(TOKEN)
        .max_sse_event_size(64 << 20);
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("MCP handshake over streamable HTTP")
}

#[tokio::test]
async fn a_large_artifact_is_kept_until_it_expires() {
    let server = server(common::python()).await;
    let client = connect_http_large(&format!("{}/mcp", server.url)).await;
    let out = call(
        &client,
        "execute_code",
        json!({"code": "open('big.bin', 'wb').write(bytes(range(256)) * (80 << 10))"}),
    )
    .await
    .unwrap();
    let big = 256 * (80 << 10);
    let text = text(&out);
    assert!(
        text.contains(&format!("[artifact big.bin ({big} bytes")),
        "{text}"
    );
    // Only linked: neither the text nor the structured content carries it.
    assert!(text.len() < 2000, "{} characters", text.len());
    let structured: &Value = out.structured_content.as_ref().unwrap();
    assert!(structured["artifacts"][0].get("base64").is_none());
    let uri = structured["artifacts"][0]["uri"]
        .as_str()
        .unwrap()
        .to_string();
    let read = client
        .read_resource(ReadResourceRequestParams::new(uri.clone()))
        .await
        .unwrap();
    let (bytes, _) = blob(&read.contents);
    assert_eq!(bytes.len(), big);
    assert_eq!(&bytes[..4], &[0, 1, 2, 3]);
    // Past the TTL it is gone, listed nowhere and read as not found.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let err = client
        .read_resource(ReadResourceRequestParams::new(uri.clone()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");
    assert!(client.list_all_resources().await.unwrap().is_empty());
    client.cancel().await.unwrap();
    server.stop().await;
}

/// `GET /artifacts/{run}/{path}` of an `artifact://{run}/{path}` URI, with
/// the token.
async fn download(server: &TestServer, uri: &str) -> reqwest::Response {
    let url = format!("{}/artifacts/{}", server.url, &uri["artifact://".len()..]);
    server
        .client
        .get(&url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
}

/// A run's artifacts as an MCP result lists them: (path, uri).
fn linked(out: &rmcp::model::CallToolResult) -> Vec<(String, Option<String>)> {
    out.structured_content.as_ref().unwrap()["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["path"].as_str().unwrap().to_string(),
                a["uri"].as_str().map(str::to_string),
            )
        })
        .collect()
}

#[tokio::test]
async fn each_of_a_thousand_files_is_linked_and_readable() {
    let server = server(common::python()).await;
    let client = connect_http(&format!("{}/mcp", server.url), Some(TOKEN)).await;
    let out = call(
        &client,
        "execute_code",
        json!({"code": "for i in range(1000):\n    open(f'f{i:04}.txt', 'w').write(str(i) * 3)"}),
    )
    .await
    .unwrap();
    assert_ne!(out.is_error, Some(true), "{out:?}");
    let links = linked(&out);
    assert_eq!(links.len(), 1000);
    for (i, (path, uri)) in links.iter().enumerate() {
        assert_eq!(path, &format!("f{i:04}.txt"));
        let uri = uri
            .as_deref()
            .unwrap_or_else(|| panic!("{path} has no uri"));
        assert!(uri.ends_with(&format!("/{path}")), "{uri}");
    }
    for i in [0, 499, 999] {
        let resp = download(&server, links[i].1.as_deref().unwrap()).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), i.to_string().repeat(3));
    }
    assert_eq!(client.list_all_resources().await.unwrap().len(), 1000);
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_file_named_with_spaces_or_letters_a_uri_cannot_hold_is_linked_encoded() {
    let server = server(common::python()).await;
    let client = connect_http(&format!("{}/mcp", server.url), Some(TOKEN)).await;
    let code = "import os\nos.mkdir('my dir')\nfor name in ['my dir/a b.txt', 'ü.txt', 'h#1?.txt', '100%.txt']:\n    open(name, 'w').write(name)";
    let out = call(&client, "execute_code", json!({ "code": code }))
        .await
        .unwrap();
    assert_ne!(out.is_error, Some(true), "{out:?}");
    let links = linked(&out);
    let uris: Vec<(&str, &str)> = links
        .iter()
        .map(|(path, uri)| (path.as_str(), uri.as_deref().unwrap()))
        .collect();
    let mut tails: Vec<&str> = uris
        .iter()
        .map(|(_, uri)| uri.split_once("://").unwrap().1.split_once('/').unwrap().1)
        .collect();
    tails.sort_unstable();
    assert_eq!(
        tails,
        [
            "%C3%BC.txt",
            "100%25.txt",
            "h%231%3F.txt",
            "my%20dir/a%20b.txt"
        ]
    );
    for (path, uri) in &uris {
        // The URI as given, and as a client that decodes it sends it.
        let run = &uri["artifact://".len()..].split_once('/').unwrap().0;
        for asked in [uri.to_string(), format!("artifact://{run}/{path}")] {
            let read = client
                .read_resource(ReadResourceRequestParams::new(asked.clone()))
                .await
                .unwrap_or_else(|e| panic!("{asked}: {e}"));
            let (bytes, _) = match &read.contents[0] {
                ResourceContents::TextResourceContents { text, .. } => {
                    (text.as_bytes().to_vec(), ())
                }
                _ => (blob(&read.contents).0, ()),
            };
            assert_eq!(bytes, path.as_bytes(), "{asked}");
        }
        // Over HTTP the URI's path is the URL's as it stands.
        let resp = download(&server, uri).await;
        assert_eq!(resp.status(), 200, "{uri}");
        assert_eq!(resp.text().await.unwrap(), *path);
    }
    let listed = client.list_all_resources().await.unwrap();
    for (_, uri) in &uris {
        assert!(
            listed.iter().any(|r| r.uri == *uri),
            "{uri} not in {listed:?}"
        );
    }
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn only_the_files_kept_are_linked_each_to_its_own() {
    let mut config = common::config();
    config.token = Some(TOKEN.into());
    config.mcp_max_artifact_bytes = 50_000;
    config.artifacts.max_owner_bytes = 10_000;
    let server = TestServer::with_config(config).await;
    let client = connect_http(&format!("{}/mcp", server.url), Some(TOKEN)).await;
    // b.bin is over the run's cap (no content); c.bin is within it but
    // over the client's share of the store.
    let code = "open('a.txt', 'w').write('a' * 10)\nopen('b.bin', 'wb').write(bytes(60_000))\nopen('c.bin', 'wb').write(bytes(20_000))\nopen('d.txt', 'w').write('d' * 10)";
    let out = call(&client, "execute_code", json!({ "code": code }))
        .await
        .unwrap();
    let links = linked(&out);
    let paths: Vec<&str> = links.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["a.txt", "b.bin", "c.bin", "d.txt"]);
    let linked_to: Vec<Option<&str>> = links
        .iter()
        .map(|(_, uri)| uri.as_deref().map(|u| u.rsplit('/').next().unwrap()))
        .collect();
    assert_eq!(linked_to, [Some("a.txt"), None, None, Some("d.txt")]);
    for (path, uri) in links.iter().filter(|(_, uri)| uri.is_some()) {
        let resp = download(&server, uri.as_deref().unwrap()).await;
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(resp.text().await.unwrap(), path[..1].repeat(10));
    }
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn empty_files_with_long_names_count_against_the_clients_cap() {
    let mut config = common::config();
    config.token = Some(TOKEN.into());
    // Room for one run below of 100 empty files with 200-byte names
    // (~31 KB with their entries), not two.
    config.artifacts.max_owner_bytes = 50_000;
    let server = TestServer::with_config(config).await;
    let client = connect_http(&format!("{}/mcp", server.url), Some(TOKEN)).await;
    let code = |tag: &str| json!({"code": format!("for i in range(100):\n    open(f'{tag}{{i:03}}' + 'n' * 196, 'w').close()")});
    let first = linked(&call(&client, "execute_code", code("a")).await.unwrap());
    assert_eq!(first.len(), 100);
    assert!(first.iter().all(|(_, uri)| uri.is_some()));
    let second = linked(&call(&client, "execute_code", code("b")).await.unwrap());
    assert!(second.iter().all(|(_, uri)| uri.is_some()));
    // The second run evicted the first: only its files are listed.
    let listed: Vec<String> = client
        .list_all_resources()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name[..4].to_string())
        .collect();
    assert_eq!(listed.len(), 100, "{listed:?}");
    assert!(
        listed.iter().all(|name| name.starts_with('b')),
        "{listed:?}"
    );
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn execute_code_takes_what_execute_takes_and_refuses_alike() {
    let server = server(common::python()).await;
    let client = connect_http(&format!("{}/mcp", server.url), Some(TOKEN)).await;
    let args = json!({
        "code": "import resource, sys\nprint(sys.stdin.read().strip(), open('in/a.txt').read(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])",
        "stdin": "from stdin",
        "files": {"in/a.txt": "file"},
        "limits": {"open_files": 64},
    });
    let out = call(&client, "execute_code", args.clone()).await.unwrap();
    let http: Value = server
        .client
        .post(format!("{}/execute", server.url))
        .bearer_auth(TOKEN)
        .json(&args)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mcp = out.structured_content.unwrap();
    assert_eq!(mcp["stdout"], "from stdin file 64\n", "{mcp}");
    assert_eq!(mcp["stdout"], http["stdout"]);
    // The same refusals: a zero limit, an unknown field.
    for bad in [
        json!({"code": "pass", "limits": {"open_files": 0}}),
        json!({"code": "pass", "timout": 3}),
    ] {
        let resp = server
            .client
            .post(format!("{}/execute", server.url))
            .bearer_auth(TOKEN)
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{bad}");
        match call(&client, "execute_code", bad.clone()).await {
            Ok(out) => {
                assert_eq!(out.is_error, Some(true), "{bad}: {out:?}");
                let shown = text(&out);
                assert!(
                    shown.contains("bad_request") || shown.contains("unknown field `timout`"),
                    "{bad}: {shown}"
                );
            }
            Err(err) => assert!(err.to_string().contains("timout"), "{bad}: {err}"),
        }
    }
    client.cancel().await.unwrap();
    server.stop().await;
}
