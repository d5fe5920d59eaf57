//! The fake as a client sees it over HTTP: a write comes back in later lists and in a watch held open
//! since before it, keeping to the watch's selector; an unchanged write changes nothing; the status
//! subresource writes only the status; a restart expires the versions handed out before (410).

use std::net::SocketAddr;
use std::time::Duration;

use fake_apiserver::collections::Collection;
use fake_apiserver::{Fake, Options};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
const APPLY: &str = "application/apply-patch+yaml";
const MANAGED: &str = "app.kubernetes.io%2Fmanaged-by%3Dmemcached-operator";

/// One HTTP/1.1 exchange on its own connection: the status and the body as JSON.
async fn call(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: {APPLY}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A watch opened now: what it has sent within `wait`, as text (chunk sizes included).
async fn watch_for(
    addr: SocketAddr,
    path: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<String> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::spawn(async move {
        let mut seen = Vec::new();
        let _ = tokio::time::timeout(wait, async {
            let mut buffer = [0; 4096];
            while let Ok(n) = stream.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buffer[..n]);
            }
        })
        .await;
        String::from_utf8_lossy(&seen).into_owned()
    })
}

/// The fake serving Deployments, the kind of child these tests write.
fn options() -> Options {
    Options {
        children: vec![Collection::new("apps/v1", "deployments", "Deployment")],
        ..Options::default()
    }
}

fn deployment(name: &str, managed: bool, replicas: u64) -> Value {
    let labels = if managed {
        json!({"app.kubernetes.io/managed-by": "memcached-operator"})
    } else {
        json!({})
    };
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "labels": labels}, "spec": {"replicas": replicas}})
}

#[tokio::test]
async fn writes_come_back_in_lists_and_in_watches_held_open_by_selector() {
    let fake = Fake::start(options()).await.unwrap();
    let addr = fake.addr();
    let (_, list) = call(
        addr,
        "GET",
        &format!("{DEPLOYMENTS}?labelSelector={MANAGED}"),
        None,
    )
    .await;
    let version = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let watch = watch_for(
        addr,
        &format!("{DEPLOYMENTS}?watch=true&resourceVersion={version}&labelSelector={MANAGED}"),
        Duration::from_millis(500),
    )
    .await;

    let (code, created) = call(
        addr,
        "PATCH",
        &format!("{DEPLOYMENTS}/mine"),
        Some(&deployment("mine", true, 1)),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let (code, again) = call(
        addr,
        "PATCH",
        &format!("{DEPLOYMENTS}/mine"),
        Some(&deployment("mine", true, 1)),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        again["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"],
        "an unchanged apply changes nothing"
    );
    call(
        addr,
        "PATCH",
        &format!("{DEPLOYMENTS}/foreign"),
        Some(&deployment("foreign", false, 1)),
    )
    .await;
    let status = json!({"status": {"replicas": 1}, "spec": {"replicas": 5}});
    let (code, with_status) = call(
        addr,
        "PATCH",
        &format!("{DEPLOYMENTS}/mine/status"),
        Some(&status),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(with_status["status"]["replicas"], 1);
    assert_eq!(
        with_status["spec"]["replicas"], 1,
        "a status write leaves the spec alone"
    );

    let seen = watch.await.unwrap();
    assert_eq!(seen.matches("\"ADDED\"").count(), 1, "{seen}");
    assert_eq!(seen.matches("\"MODIFIED\"").count(), 1, "{seen}");
    assert!(
        !seen.contains("foreign"),
        "the watch keeps to its selector: {seen}"
    );
    let (_, all) = call(addr, "GET", DEPLOYMENTS, None).await;
    assert_eq!(all["items"].as_array().unwrap().len(), 2, "{all}");
    assert_eq!(fake.count(), 7);
}

#[tokio::test]
async fn a_restarted_server_expires_the_versions_it_handed_out() {
    let fake = Fake::start(Options {
        outages: true,
        ..options()
    })
    .await
    .unwrap();
    let addr = fake.addr();
    let (_, list) = call(addr, "GET", DEPLOYMENTS, None).await;
    let version = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    fake.outage().unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "nothing listens during the outage"
    );
    fake.back(true).unwrap();
    let watch = watch_for(
        addr,
        &format!("{DEPLOYMENTS}?watch=true&resourceVersion={version}"),
        Duration::from_millis(500),
    )
    .await;
    let seen = watch.await.unwrap();
    assert!(
        seen.contains("\"ERROR\"") && seen.contains("\"code\":410"),
        "{seen}"
    );
}
