//! The copy itself, one source server to one target server: the walk of the source's dump, a batch of
//! keys at a time ([`walk`]), the sweep that follows it ([`sweep`]), the connections ([`conn`]) and the
//! wire format of keys and values ([`wire`]). The [`Copier`](super::copier::Copier) runs it.

mod conn;
mod sweep;
mod walk;
mod wire;

pub(crate) use walk::{Copy, Pass, Walked, flush};
