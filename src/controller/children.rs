//! Applying and removing one child object: server-side apply with the operator's field manager, only
//! when the cached live object differs from the desired one; deletion only of what the cache shows.

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};

use super::Error;
use super::compact::{Cache, Compact, Compactable};
use super::written::Written;
use crate::resources::{Instance, drift, labels};

/// A child after [`ensure`]: what it looks like now and, when it was applied, what it looked like before.
pub struct Applied<K> {
    pub current: Arc<K>,
    /// `None` when the child did not exist (or was not cached yet).
    pub previous: Option<Arc<K>>,
    /// Whether an apply request was sent.
    pub changed: bool,
}

/// Where a child is read from and its writes are remembered.
pub struct Source<'a, K: Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash,
{
    pub store: &'a Cache<K>,
    pub written: &'a Written,
    pub dt: &'a K::DynamicType,
}

/// Child `name` of `instance` as last seen (the cache, or this operator's own newer write), refusing one
/// that another owner controls.
pub fn cached<K>(
    instance: &Instance<'_>,
    name: &str,
    source: &Source<'_, K>,
) -> Result<Option<Arc<K>>, Error>
where
    K: Compactable + Send + Sync,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    let dt = source.dt;
    let in_cache = source
        .store
        .get(instance.namespace, name, dt)
        .map_err(|error| Error::Malformed(format!("the cached {} {name}: {error}", K::kind(dt))))?;
    let Some(live) = source
        .written
        .fresher(instance.namespace, name, dt, in_cache)
        .object
    else {
        return Ok(None);
    };
    ours::<K>(instance, name, live.owner_references(), dt)?;
    Ok(Some(live))
}

/// Refuses a child that another owner controls.
fn ours<K: Resource>(
    instance: &Instance<'_>,
    name: &str,
    owners: &[OwnerReference],
    dt: &K::DynamicType,
) -> Result<(), Error> {
    match owners
        .iter()
        .find(|o| o.controller == Some(true) && o.uid != instance.uid())
    {
        Some(owner) => Err(Error::ForeignOwner {
            kind: K::kind(dt).into_owned(),
            name: name.to_owned(),
            owner_uid: owner.uid.clone(),
        }),
        None => Ok(()),
    }
}

/// The cached copy of child `name` when it is known to be up to date with the desired object of
/// `fingerprint` already: the same copy was found so by an earlier reconcile, and no write of the
/// operator's own is pending for it (else the cache may lag behind that write, see [`Written`]).
fn known_up_to_date<K>(
    instance: &Instance<'_>,
    name: &str,
    source: &Source<'_, K>,
    fingerprint: u64,
) -> Option<Arc<Compact<K>>>
where
    K: Compactable,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    let compact = source
        .store
        .get_compact(instance.namespace, name, source.dt)?;
    (compact.verified_for(fingerprint)
        && !source
            .written
            .holds::<K>(instance.namespace, name, source.dt))
    .then_some(compact)
}

/// Makes the child `desired` exist as desired. Reads the live object from `store`; sends a server-side
/// apply only when the live object is missing, drifted, or stamped by a different desired object.
pub async fn ensure<K>(
    instance: &Instance<'_>,
    desired: K,
    source: &Source<'_, K>,
    api: Api<K>,
) -> Result<Applied<K>, Error>
where
    K: Compactable + Debug + Send + Sync,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    let dt = source.dt;
    let name = desired.name_any();
    let desired = drift::stamp(desired);
    let fingerprint = drift::fingerprint(&desired);
    // Most reconciles find most children as they left them: the copy they checked then needs no second
    // comparison (nor, for its owner, a second look: owner references are part of the desired object).
    if let Some(compact) = known_up_to_date(instance, &name, source, fingerprint) {
        let current = compact.decode().map_err(|error| {
            Error::Malformed(format!("the cached {} {name}: {error}", K::kind(dt)))
        })?;
        return Ok(Applied {
            current: Arc::new(current),
            previous: None,
            changed: false,
        });
    }
    let live = cached(instance, &name, source)?;
    if let Some(live) = &live
        && drift::is_up_to_date(live.as_ref(), &desired)
    {
        // Remembered on the cached copy when that is what was compared (not a newer answer of ours).
        if let Some(compact) = source.store.get_compact(instance.namespace, &name, dt)
            && compact.meta().resource_version == live.meta().resource_version
        {
            compact.mark_verified(fingerprint);
        }
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
    let applied = Arc::new(applied);
    source.written.remember(applied.clone(), dt);
    Ok(Applied {
        current: applied,
        previous: live,
        changed: true,
    })
}

/// Deletes child `name` of `instance` if the cache shows it; returns whether a delete was sent. A child
/// that is already gone (404) counts as deleted.
pub async fn remove<K>(
    instance: &Instance<'_>,
    name: &str,
    source: &Source<'_, K>,
    api: Api<K>,
) -> Result<bool, Error>
where
    K: Compactable + Debug + Send + Sync,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    let dt = source.dt;
    // One already on its way out needs no second delete.
    let Some(live) =
        cached(instance, name, source)?.filter(|l| l.meta().deletion_timestamp.is_none())
    else {
        return Ok(false);
    };
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(source) => {
            return Err(Error::Delete {
                kind: K::kind(dt).into_owned(),
                name: name.to_owned(),
                source,
            });
        }
    }
    source.written.remember_deleted(live.as_ref(), dt);
    Ok(true)
}
