//! Applying one child object: server-side apply with the operator's field manager, only when the cached
//! live object differs from the desired one.

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Context, Error};
use crate::resources::{Instance, drift, labels};

/// A child after [`ensure`]: what it looks like now and, when it was applied, what it looked like before.
pub struct Applied<K> {
    pub current: Arc<K>,
    /// `None` when the child did not exist (or was not cached yet).
    pub previous: Option<Arc<K>>,
    /// Whether an apply request was sent.
    pub changed: bool,
}

/// Makes the child `desired` exist as desired. Reads the live object from `store`; sends a server-side
/// apply only when the live object is missing, drifted, or stamped by a different desired object.
pub async fn ensure<K>(
    ctx: &Context,
    instance: &Instance<'_>,
    desired: K,
    store: &Store<K>,
) -> Result<Applied<K>, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug,
{
    let kind = K::kind(&()).into_owned();
    let desired = drift::stamp(desired);
    let live = store.get(&ObjectRef::new(instance.name).within(instance.namespace));
    if let Some(live) = &live {
        if let Some(owner) = live
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && o.uid != instance.uid())
        {
            return Err(Error::ForeignOwner {
                kind: kind.clone(),
                name: instance.name.to_owned(),
                owner_uid: owner.uid.clone(),
            });
        }
        if drift::is_up_to_date(live.as_ref(), &desired) {
            return Ok(Applied {
                current: live.clone(),
                previous: None,
                changed: false,
            });
        }
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), instance.namespace);
    let params = PatchParams::apply(labels::MANAGER_NAME).force();
    let mut applied = api
        .patch(instance.name, &params, &Patch::Apply(&desired))
        .await
        .map_err(|source| Error::Apply {
            kind,
            name: instance.name.to_owned(),
            source,
        })?;
    applied.meta_mut().managed_fields = None;
    Ok(Applied {
        current: Arc::new(applied),
        previous: live,
        changed: true,
    })
}
