//! Applying and removing one child object: server-side apply with the operator's field manager, only
//! when the cached live object differs from the desired one; deletion only of what the cache shows.

use std::fmt::Debug;
use std::sync::Arc;

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Error;
use crate::resources::{Instance, drift, labels};

/// A child after [`ensure`]: what it looks like now and, when it was applied, what it looked like before.
pub struct Applied<K> {
    pub current: Arc<K>,
    /// `None` when the child did not exist (or was not cached yet).
    pub previous: Option<Arc<K>>,
    /// Whether an apply request was sent.
    pub changed: bool,
}

/// Cached child `name` of `instance`, refusing one that another owner controls.
fn cached<K>(
    instance: &Instance<'_>,
    name: &str,
    store: &Store<K>,
    dt: &K::DynamicType,
) -> Result<Option<Arc<K>>, Error>
where
    K: Resource + Clone,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    let Some(live) = store.get(&ObjectRef::new_with(name, dt.clone()).within(instance.namespace))
    else {
        return Ok(None);
    };
    if let Some(owner) = live
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.uid != instance.uid())
    {
        return Err(Error::ForeignOwner {
            kind: K::kind(dt).into_owned(),
            name: name.to_owned(),
            owner_uid: owner.uid.clone(),
        });
    }
    Ok(Some(live))
}

/// Makes the child `desired` exist as desired. Reads the live object from `store`; sends a server-side
/// apply only when the live object is missing, drifted, or stamped by a different desired object.
pub async fn ensure<K>(
    instance: &Instance<'_>,
    desired: K,
    store: &Store<K>,
    api: Api<K>,
    dt: &K::DynamicType,
) -> Result<Applied<K>, Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    let name = desired.name_any();
    let desired = drift::stamp(desired);
    let live = cached(instance, &name, store, dt)?;
    if let Some(live) = &live
        && drift::is_up_to_date(live.as_ref(), &desired)
    {
        return Ok(Applied {
            current: live.clone(),
            previous: None,
            changed: false,
        });
    }
    let params = PatchParams::apply(labels::MANAGER_NAME).force();
    let mut applied = api
        .patch(&name, &params, &Patch::Apply(&desired))
        .await
        .map_err(|source| Error::Apply {
            kind: K::kind(dt).into_owned(),
            name: name.clone(),
            source,
        })?;
    applied.meta_mut().managed_fields = None;
    Ok(Applied {
        current: Arc::new(applied),
        previous: live,
        changed: true,
    })
}

/// Deletes child `name` of `instance` if the cache shows it; returns whether a delete was sent. A child
/// that is already gone (404) counts as deleted.
pub async fn remove<K>(
    instance: &Instance<'_>,
    name: &str,
    store: &Store<K>,
    api: Api<K>,
    dt: &K::DynamicType,
) -> Result<bool, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    if cached(instance, name, store, dt)?.is_none() {
        return Ok(false);
    }
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(true),
        Err(source) => Err(Error::Delete {
            kind: K::kind(dt).into_owned(),
            name: name.to_owned(),
            source,
        }),
    }
}
