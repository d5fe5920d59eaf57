//! What each request gets: the verbs of every collection, the status subresource, discovery of a
//! group/version's resources, and the 404s of a missing CRD or of anything the fake does not serve.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::apply::apply;
use crate::collections::OPERATOR_GROUP;
use crate::path::{self, Target};
use crate::request::Req;
use crate::selector::Selector;
use crate::store::{Refusal, Store, WatchFilter, partial_object_metadata};

/// How to answer a request.
pub(crate) enum Answer {
    Json(StatusCode, Value),
    /// A watch of `plural`: 200, then every change after `from` that `filter` selects, held open.
    Watch {
        plural: &'static str,
        from: u64,
        filter: WatchFilter,
    },
    /// A watch from a version that has expired: 200, one `ERROR` event (410 `Expired`), then the end.
    Expired(String),
    /// A plain-text answer, as the API server's own 404 for a path nothing serves.
    Text(StatusCode, &'static str),
}

impl From<Refusal> for Answer {
    fn from(refusal: Refusal) -> Self {
        Self::Json(refusal.code, refusal.to_status())
    }
}

impl Answer {
    /// The status the request is recorded with.
    pub(crate) fn code(&self) -> u16 {
        match self {
            Self::Json(code, _) | Self::Text(code, _) => code.as_u16(),
            Self::Watch { .. } | Self::Expired(_) => 200,
        }
    }
}

fn not_served(req: &Req) -> Answer {
    Refusal::new(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!(
            "the fake API server does not serve {} {}",
            req.method, req.path
        ),
    )
    .into()
}

/// The answer to `req`, with the store as it is now.
pub(crate) fn answer(store: &mut Store, req: &Req) -> Answer {
    if store.settings.crd_missing && req.path.starts_with(&format!("/apis/{OPERATOR_GROUP}/")) {
        return Answer::Text(StatusCode::NOT_FOUND, "404 page not found\n");
    }
    let Some(target) = path::parse(&req.path) else {
        return discovery(store, req);
    };
    let Some(collection) = store.find(&target.api_version, target.plural) else {
        return not_served(req);
    };
    if !store.serves(&collection) {
        return not_served(req);
    }
    if target.subresource.is_some_and(|sub| sub != "status") {
        return not_served(req);
    }
    let plural = collection.plural;
    let metadata_only = req
        .accept
        .as_deref()
        .is_some_and(|accept| accept.contains("as=PartialObjectMetadata"));
    let selector = match Selector::parse(req.param("labelSelector").unwrap_or_default()) {
        Ok(selector) => selector,
        Err(e) => {
            return Refusal::new(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()).into();
        }
    };
    let namespace = target.namespace.unwrap_or_default();
    let result = match req.verb() {
        "watch" => {
            let from = req
                .param("resourceVersion")
                .and_then(|rv| rv.parse().ok())
                .unwrap_or(0);
            if let Some(message) = store.expired(from) {
                return Answer::Expired(message);
            }
            let filter = WatchFilter {
                namespace: target.namespace.map(str::to_owned),
                selector,
                metadata_only,
            };
            return Answer::Watch {
                plural,
                from,
                filter,
            };
        }
        "list" => store
            .list(plural, target.namespace, &selector, metadata_only)
            .map(|list| (StatusCode::OK, list)),
        "get" => {
            let name = target.name.unwrap_or_default();
            match store.get(plural, namespace, name) {
                Some(obj) if metadata_only => Ok(partial_object_metadata(&obj["metadata"])),
                Some(obj) => Ok(obj.clone()),
                None => Err(Refusal::not_found(plural, name)),
            }
            .map(|obj| (StatusCode::OK, obj))
        }
        "create" => {
            let mut obj = req.body.clone();
            // What only the server sets.
            if let Some(meta) = obj["metadata"].as_object_mut() {
                for field in ["uid", "resourceVersion", "creationTimestamp", "generation"] {
                    meta.remove(field);
                }
            }
            obj["metadata"]["namespace"] = json!(namespace);
            store
                .create(plural, obj)
                .map(|obj| (StatusCode::CREATED, obj))
        }
        "delete" => {
            let name = target.name.unwrap_or_default();
            store
                .delete(plural, namespace, name)
                .map(|obj| (StatusCode::OK, obj))
                .ok_or_else(|| Refusal::not_found(plural, name))
        }
        verb @ ("update" | "apply" | "patch-json" | "patch-strategic" | "patch-merge") => {
            write(store, verb, plural, &target, &req.body)
        }
        _ => return not_served(req),
    };
    match result {
        Ok((code, obj)) => Answer::Json(code, obj),
        Err(refusal) => refusal.into(),
    }
}

/// A write of one object: its status through the subresource, or anything else of it (which leaves the
/// status alone). A server-side apply of a missing object creates it.
fn write(
    store: &mut Store,
    verb: &str,
    plural: &'static str,
    target: &Target<'_>,
    body: &Value,
) -> Result<(StatusCode, Value), Refusal> {
    let namespace = target.namespace.unwrap_or_default();
    let name = target.name.unwrap_or_default();
    let status_only = target.subresource == Some("status");
    let Some(before) = store.get(plural, namespace, name).cloned() else {
        if verb == "apply" && !status_only {
            let mut obj = body.clone();
            obj["metadata"]["namespace"] = json!(namespace);
            obj["metadata"]["name"] = json!(name);
            return store
                .create(plural, obj)
                .map(|obj| (StatusCode::CREATED, obj));
        }
        return Err(Refusal::not_found(plural, name));
    };
    let changes = if status_only {
        json!({"status": body["status"]})
    } else {
        let mut body = body.clone();
        if let Some(map) = body.as_object_mut()
            && verb != "patch-json"
        {
            map.remove("status");
        }
        body
    };
    let mut obj = before.clone();
    match verb {
        "update" => {
            obj = changes;
            obj["status"] = before["status"].clone();
        }
        "apply" => apply(&mut obj, &changes),
        "patch-json" => {
            let invalid = |e: &dyn std::fmt::Display| {
                Refusal::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e.to_string())
            };
            let patch: json_patch::Patch =
                serde_json::from_value(changes).map_err(|e| invalid(&e))?;
            json_patch::patch(&mut obj, &patch).map_err(|e| invalid(&e))?;
        }
        _ => json_patch::merge(&mut obj, &changes),
    }
    if !obj.is_object() {
        return Err(Refusal::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "the write leaves no object",
        ));
    }
    // Identity is the server's.
    for field in ["name", "namespace", "uid", "creationTimestamp"] {
        obj["metadata"][field] = before["metadata"][field].clone();
    }
    store.update(plural, obj).map(|obj| (StatusCode::OK, obj))
}

/// A read of a path that names no collection: the discovery document of a group/version
/// (`/apis/<group>/<version>`) that serves a collection, a 404 otherwise (a CRD not installed).
fn discovery(store: &Store, req: &Req) -> Answer {
    let group_version = match req.path.trim_matches('/').split('/').collect::<Vec<_>>()[..] {
        ["apis", group, version] if req.method == Method::GET => format!("{group}/{version}"),
        _ => return not_served(req),
    };
    let served = store.served_in(&group_version);
    if served.is_empty() {
        return Refusal::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        )
        .into();
    }
    let resources: Vec<Value> = served
        .iter()
        .map(|c| {
            json!({"name": c.plural, "singularName": c.kind.to_lowercase(), "namespaced": true,
                   "kind": c.kind, "verbs": ["get", "list", "watch", "create", "patch", "delete"]})
        })
        .collect();
    Answer::Json(
        StatusCode::OK,
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
               "resources": resources}),
    )
}
