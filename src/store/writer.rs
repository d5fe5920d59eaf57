//! The write side of storage: the client that sends the operator's writes, the answers it keeps until the
//! caches catch up (read-your-writes), and the event publisher. What a reconcile writes through.

use std::sync::Arc;

use kube::{Api, Client, Resource};

use super::events::Publisher;
use super::written::Written;

/// The client, read-your-writes and the event publisher.
pub struct Writer {
    pub client: Client,
    /// The answers to this operator's latest writes, until the caches catch up; shared with the watches,
    /// which end an answer when they see the object deleted.
    pub written: Arc<Written>,
    pub events: Publisher,
}

impl Writer {
    /// The API of `K` in `namespace`, through this writer's client.
    pub fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), namespace)
    }
}
