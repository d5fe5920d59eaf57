//! The scripted API server: kube's client over a `tower_test` mock whose answers a test writes down.
//! Two ways to script it, which one server combines:
//!
//! - a script ([`Exchange`]s): each expected request in order, with its answer; a request out of order,
//!   one missing, or one after the script ends fails the test (the reconciler's contract, request by
//!   request);
//! - rules ([`Rule`]): standing answers for whatever requests they take, in any order and any number of
//!   times (the stats collector's Secret reads and status writes, the metrics endpoint's reviews).
//!
//! A request a rule takes is answered by it; any other must be the script's next. With rules and an
//! empty script, a request no rule takes is answered 404 and fails the test when its [`Api`] is dropped
//! or finished. Every request is recorded ([`Seen`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::{OwnedRwLockWriteGuard, RwLock};
use tower_test::mock::{self, Handle};

/// The namespace of the client, and of the objects the helpers name.
pub const NS: &str = "default";

/// One expected request and the answer to give.
pub struct Exchange {
    pub method: Method,
    /// Path the request must have (query excluded).
    pub path: String,
    /// Substrings the query must contain.
    pub query: Vec<&'static str>,
    /// Substrings the query must not contain.
    pub not_query: Vec<&'static str>,
    pub status: StatusCode,
    /// Answer body; `None` echoes the request body (what a server does for an apply of a new object).
    pub reply: Option<Value>,
    /// Answer made from the request body, when set (instead of `reply` or the echo).
    pub answer: Option<fn(&Value) -> Value>,
    /// No answer at all: the connection fails (an API server that is down).
    pub unanswered: bool,
}

pub fn expect(method: Method, path: &str) -> Exchange {
    Exchange {
        method,
        path: path.to_owned(),
        query: vec![],
        not_query: vec![],
        status: StatusCode::OK,
        reply: None,
        answer: None,
        unanswered: false,
    }
}

impl Exchange {
    /// A server-side apply that takes over fields others own: to an object the operator manages.
    pub fn apply(mut self) -> Self {
        self.query = vec!["fieldManager=memcached-operator", "force=true"];
        self
    }
    /// A server-side apply that creates a child: not forced, so that an object of that name which is not
    /// the operator's answers a conflict instead of being taken over.
    pub fn create(mut self) -> Self {
        self.query = vec!["fieldManager=memcached-operator"];
        self.not_query = vec!["force"];
        self
    }
    pub fn reply(mut self, status: StatusCode, body: Value) -> Self {
        self.status = status;
        self.reply = Some(body);
        self
    }
    /// Answers with `answer(request body)`: an object as the server stores it, say.
    pub fn answer(mut self, answer: fn(&Value) -> Value) -> Self {
        self.answer = Some(answer);
        self
    }
    /// The request fails without an answer, as when the API server is down.
    pub fn unanswered(mut self) -> Self {
        self.unanswered = true;
        self
    }
    pub fn fail(self, code: u16, reason: &str) -> Self {
        let status = StatusCode::from_u16(code).unwrap();
        self.reply(status, failure(code, reason))
    }
}

/// A `Status` failure as the API server sends it.
pub fn failure(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
           "reason": reason, "message": format!("mock says {reason}")})
}

/// A request the client made, and when it arrived.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub body: Value,
    pub at: Instant,
}

/// A standing answer: the status and body for the requests it takes, `None` for the others.
pub type Rule = Box<dyn Fn(&Seen) -> Option<(StatusCode, Value)> + Send + Sync>;

/// What a server returns for a write: the object, with the metadata a status-only body leaves out.
pub fn echo(body: &Value, path: &str) -> Value {
    let mut obj = body.clone();
    if obj.get("metadata").is_none() {
        let name = path
            .trim_end_matches("/status")
            .rsplit('/')
            .next()
            .unwrap_or_default();
        obj["metadata"] = json!({"name": name, "namespace": NS});
        obj["spec"] = json!({});
    } else if path.ends_with("/status") {
        obj["metadata"]["namespace"] = json!(NS);
        if obj.get("spec").is_none() {
            obj["spec"] = json!({});
        }
    }
    obj
}

/// Answers every write (POST 201, PATCH and PUT 200) with its [`echo`]: events published, statuses
/// applied.
pub fn writes() -> Rule {
    Box::new(|seen| match seen.method {
        Method::POST => Some((StatusCode::CREATED, echo(&seen.body, &seen.path))),
        Method::PATCH | Method::PUT => Some((StatusCode::OK, echo(&seen.body, &seen.path))),
        _ => None,
    })
}

/// Secrets by name in [`NS`], as the API server holds them; the test changes them while the client runs.
#[derive(Clone, Default)]
pub struct Secrets(Arc<Mutex<BTreeMap<String, Value>>>);

impl Secrets {
    /// Stores (or replaces) the Secret `name`, served whole as `secret`.
    pub fn insert(&self, name: &str, secret: Value) {
        self.0.lock().unwrap().insert(name.to_owned(), secret);
    }

    /// Answers a GET of a Secret with it, or 404 when there is none of that name.
    pub fn rule(&self) -> Rule {
        let secrets = self.0.clone();
        let prefix = format!("/api/v1/namespaces/{NS}/secrets/");
        Box::new(move |seen| {
            let name = seen.path.strip_prefix(&prefix)?;
            if seen.method != Method::GET {
                return None;
            }
            Some(match secrets.lock().unwrap().get(name) {
                Some(secret) => (StatusCode::OK, secret.clone()),
                None => (StatusCode::NOT_FOUND, failure(404, "NotFound")),
            })
        })
    }
}

/// Answers TokenReviews: each `(token, user)` of `users` authenticates as `user` (a TokenReview's
/// `status.user`); any other token is not authenticated.
pub fn token_reviews(users: Vec<(&'static str, Value)>) -> Rule {
    Box::new(move |seen| {
        if seen.method != Method::POST || seen.path != "/apis/authentication.k8s.io/v1/tokenreviews"
        {
            return None;
        }
        let token = seen.body["spec"]["token"].as_str();
        let status = match users.iter().find(|(t, _)| Some(*t) == token) {
            Some((_, user)) => json!({"authenticated": true, "user": user}),
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                            "metadata": {}, "spec": seen.body["spec"], "status": status});
        Some((StatusCode::CREATED, review))
    })
}

/// Answers SubjectAccessReviews: allowed for the users named in `allowed`, for anything they ask.
pub fn access_reviews(allowed: Vec<&'static str>) -> Rule {
    Box::new(move |seen| {
        if seen.method != Method::POST
            || seen.path != "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        {
            return None;
        }
        let user = seen.body["spec"]["user"].as_str();
        let allowed = allowed.iter().any(|a| Some(*a) == user);
        let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                            "metadata": {}, "spec": seen.body["spec"], "status": {"allowed": allowed}});
        Some((StatusCode::CREATED, review))
    })
}

/// The scripted API server behind a client: what it has seen, and its end.
pub struct Api {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Requests no rule took and the script did not expect.
    unexpected: Arc<Mutex<Vec<String>>>,
    answered: Arc<AtomicUsize>,
    gate: Arc<RwLock<()>>,
    delay: Arc<Mutex<Duration>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Api {
    /// A client whose requests go to this server: `script` in order, `rules` for what they take.
    pub fn start(script: Vec<Exchange>, rules: Vec<Rule>) -> (Client, Self) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let server = Server {
            seen: Arc::default(),
            unexpected: Arc::default(),
            answered: Arc::default(),
            gate: Arc::default(),
            delay: Arc::default(),
            rules: Arc::new(rules),
        };
        let mut api = Self {
            seen: server.seen.clone(),
            unexpected: server.unexpected.clone(),
            answered: server.answered.clone(),
            gate: server.gate.clone(),
            delay: server.delay.clone(),
            server: None,
        };
        api.server = Some(tokio::spawn(server.serve(handle, script.into())));
        (Client::new(service, NS), api)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests so far.
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// How many answers the rules have sent so far.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// The requests with `method` to `path`.
    pub fn to(&self, method: Method, path: &str) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == method && r.path == path)
            .collect()
    }

    /// The bodies of the requests whose path ends with `end`.
    pub fn bodies(&self, end: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.ends_with(end))
            .map(|r| r.body)
            .collect()
    }

    /// The status writes of instance `name`.
    pub fn status_writes(&self, name: &str) -> Vec<Seen> {
        self.to(
            Method::PATCH,
            &format!("/apis/cache.example.com/v1alpha1/namespaces/{NS}/memcacheds/{name}/status"),
        )
    }

    /// The events published.
    pub fn events(&self) -> Vec<Seen> {
        self.to(
            Method::POST,
            &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"),
        )
    }

    /// How many times the Secret `name` was read.
    pub fn secret_reads(&self, name: &str) -> usize {
        self.to(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/secrets/{name}"),
        )
        .len()
    }

    /// Answers every later request a rule takes only after `delay`, as a loaded API server would; the
    /// requests are still answered concurrently.
    pub fn delay(&self, delay: Duration) {
        *self.delay.lock().unwrap() = delay;
    }

    /// Holds every answer of the rules until the guard is dropped, as a busy API server would.
    pub async fn hold(&self) -> OwnedRwLockWriteGuard<()> {
        self.gate.clone().write_owned().await
    }

    /// Ends the server once the client is dropped: every request seen, after checking that the script was
    /// answered whole, that nothing else was sent, and that the rules took every other request.
    pub async fn finish(mut self) -> Vec<Seen> {
        if let Some(server) = self.server.take() {
            server
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        }
        self.check();
        self.requests()
    }

    fn check(&self) {
        let unexpected = self.unexpected.lock().unwrap();
        assert!(
            unexpected.is_empty(),
            "requests neither scripted nor taken by a rule: {unexpected:#?}"
        );
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.check();
        }
    }
}

/// The server's side of [`Api`].
struct Server {
    seen: Arc<Mutex<Vec<Seen>>>,
    unexpected: Arc<Mutex<Vec<String>>>,
    answered: Arc<AtomicUsize>,
    gate: Arc<RwLock<()>>,
    delay: Arc<Mutex<Duration>>,
    rules: Arc<Vec<Rule>>,
}

impl Server {
    async fn serve(
        self,
        mut handle: Handle<Request<Body>, Response<Body>>,
        mut script: VecDeque<Exchange>,
    ) {
        loop {
            let next = if !script.is_empty() {
                let next = tokio::time::timeout(Duration::from_secs(5), handle.next_request());
                match next.await {
                    Ok(Some(next)) => next,
                    _ => {
                        let want = &script[0];
                        panic!(
                            "expected {} {} but the client sent nothing more; seen so far: {:#?}",
                            want.method,
                            want.path,
                            self.seen.lock().unwrap()
                        )
                    }
                }
            } else if self.rules.is_empty() {
                // The script is done: the client must go away without another request.
                let next = tokio::time::timeout(Duration::from_secs(5), handle.next_request());
                match next.await {
                    Ok(None) => return,
                    Ok(Some((request, _))) => panic!(
                        "unexpected request after the script: {} {}; seen: {:#?}",
                        request.method(),
                        request.uri(),
                        self.seen.lock().unwrap()
                    ),
                    Err(_) => panic!("the client was not dropped after the script"),
                }
            } else {
                match handle.next_request().await {
                    Some(next) => next,
                    None => return,
                }
            };
            let (request, respond) = next;
            let seen = read(request).await;
            self.seen.lock().unwrap().push(seen.clone());
            if let Some((status, reply)) = self.rules.iter().find_map(|rule| rule(&seen)) {
                let (gate, answered) = (self.gate.clone(), self.answered.clone());
                let delay = *self.delay.lock().unwrap();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _open = gate.read().await;
                    respond.send_response(response(status, &reply));
                    answered.fetch_add(1, Ordering::SeqCst);
                });
                continue;
            }
            let Some(want) = script.pop_front() else {
                self.unexpected
                    .lock()
                    .unwrap()
                    .push(format!("{} {}?{}", seen.method, seen.path, seen.query));
                respond.send_response(response(StatusCode::NOT_FOUND, &failure(404, "NotFound")));
                continue;
            };
            self.check(&want, &seen);
            if want.unanswered {
                respond.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
                continue;
            }
            let reply = match want.answer {
                Some(answer) => answer(&seen.body),
                None => want
                    .reply
                    .clone()
                    .unwrap_or_else(|| echo(&seen.body, &seen.path)),
            };
            respond.send_response(response(want.status, &reply));
        }
    }

    /// Panics unless `seen` is the request `want` expects.
    fn check(&self, want: &Exchange, seen: &Seen) {
        let number = self.seen.lock().unwrap().len();
        assert_eq!(
            (&seen.method, seen.path.as_str()),
            (&want.method, want.path.as_str()),
            "request #{number} out of script (query {:?}, body {})",
            seen.query,
            seen.body
        );
        for q in &want.query {
            assert!(
                seen.query.contains(q),
                "{} {}: query {:?} lacks {q}",
                seen.method,
                seen.path,
                seen.query
            );
        }
        for q in &want.not_query {
            assert!(
                !seen.query.contains(q),
                "{} {}: query {:?} has {q}",
                seen.method,
                seen.path,
                seen.query
            );
        }
    }
}

async fn read(request: Request<Body>) -> Seen {
    let at = Instant::now();
    let (parts, body) = request.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    Seen {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or_default().to_owned(),
        body,
        at,
    }
}

fn response(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}
