//! Applying and removing one child object: server-side apply with the operator's field manager, only
//! when the cached live object differs from the desired one; deletion only of what the cache shows.

use std::fmt::Debug;
use std::sync::Arc;

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};

use super::error::Error;
use crate::resources::{Instance, drift, labels};
use crate::store::WriteError;
use crate::store::cache::Cache;
use crate::store::compact::{Compact, Compactable};
use crate::store::foreign::Foreign;
use crate::store::written::Written;

/// A child after [`ensure`]: what it looks like now and, when it was applied, what it looked like before.
pub struct Applied<K: Resource> {
    current: Current<K>,
    /// `None` when the child did not exist (or was not cached yet).
    pub previous: Option<Arc<K>>,
    /// Whether an apply request was sent.
    pub changed: bool,
}

/// The child as it is now: the live object that needed no apply, or the answer to the apply, decoded only
/// when read (most callers never read it).
enum Current<K: Resource> {
    Live(Arc<K>),
    Answer {
        answer: Arc<Compact<K>>,
        kind: String,
    },
}

impl<K: Compactable> Applied<K> {
    /// The child as it is now.
    pub fn current(&self) -> Result<Arc<K>, Error> {
        match &self.current {
            Current::Live(live) => Ok(live.clone()),
            Current::Answer { answer, kind } => answer.decode().map(Arc::new).map_err(|error| {
                Error::Malformed(format!(
                    "the API server's answer to applying {kind} {}: {error}",
                    answer.meta().name.as_deref().unwrap_or_default()
                ))
            }),
        }
    }
}

/// Where a child is read from and its writes are remembered.
pub struct Source<'a, K: Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash,
{
    pub store: &'a Cache<K>,
    pub written: &'a Written,
    pub dt: &'a K::DynamicType,
    pub foreign: &'a Foreign,
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
        .get(instance.namespace, name)
        .map_err(|error| Error::Malformed(format!("the cached {} {name}: {error}", K::kind(dt))))?;
    let Some(live) = source
        .written
        .fresher(instance.namespace, name, dt, in_cache)
        .object
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

/// Refuses to create child `name` when an object of its kind and name exists that the operator does not
/// manage (see [`super::runtime::foreign`]): it is someone else's, and is left untouched.
pub fn unclaimed<K>(
    instance: &Instance<'_>,
    name: &str,
    source: &Source<'_, K>,
) -> Result<(), Error>
where
    K: Resource + 'static,
    K::DynamicType: Eq + std::hash::Hash,
{
    let kind = K::kind(source.dt);
    if source
        .foreign
        .holds(&kind, instance.namespace, name, instance.uid())
    {
        return Err(Error::NotManaged {
            kind: kind.into_owned(),
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// Makes the child `desired` exist as desired. Reads the live object from `store`; sends a server-side
/// apply only when the live object is missing, drifted, or stamped by a different desired object. The
/// answer is read compact, as the cache would keep it.
pub async fn ensure<K>(
    instance: &Instance<'_>,
    desired: K,
    source: &Source<'_, K>,
    api: Api<Compact<K>>,
) -> Result<Applied<K>, Error>
where
    K: Compactable + Debug + Send + Sync,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    let dt = source.dt;
    let name = desired.name_any();
    let desired = drift::stamp(desired);
    let live = cached(instance, &name, source)?;
    if live.is_none() {
        unclaimed(instance, &name, source)?;
    }
    if let Some(live) = &live
        && drift::is_up_to_date(live.as_ref(), &desired)
    {
        return Ok(Applied {
            current: Current::Live(live.clone()),
            previous: None,
            changed: false,
        });
    }
    // Forced over a child the operator manages, to take back fields someone else changed. Not when
    // creating: should an object of that name exist after all (created after the foreign watch last
    // looked), an unforced apply answers 409 for every field its owners set differently, and that object
    // is left alone; the retry then finds it in the foreign watch.
    let mut params = PatchParams::apply(labels::MANAGER_NAME);
    if live.is_some() {
        params = params.force();
    }
    let applied = api
        .patch(&name, &params, &Patch::Apply(&desired))
        .await
        .map_err(|source| WriteError::Apply {
            kind: K::kind(dt).into_owned(),
            name: name.clone(),
            source,
        })?;
    let applied = Arc::new(applied);
    source.written.remember(applied.clone(), dt);
    Ok(Applied {
        current: Current::Answer {
            answer: applied,
            kind: K::kind(dt).into_owned(),
        },
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
    api: Api<Compact<K>>,
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
            return Err(WriteError::Delete {
                kind: K::kind(dt).into_owned(),
                name: name.to_owned(),
                source,
            }
            .into());
        }
    }
    source.written.remember_deleted(live.as_ref(), dt);
    Ok(true)
}
