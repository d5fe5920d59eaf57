//! Step 26: handing over a 1 GiB cache grows the operator's peak RSS by less than 10 MiB (issue 23): a
//! copy streams one batch of items at a time, whatever the cache holds.
//!
//! A Deployment instance of two servers (`maxMemoryMB` 800 each: 512 MiB of values of 100 KiB fit
//! with room for memcached's slab overhead) is filled from this machine with 10 486 items of 100 KiB
//! (1 GiB), placed by jump hash over the slots; then a changed flag rolls it out, each new server
//! getting the items of the one it replaces. The operator runs on this machine (step 2), so its
//! `/proc/<pid>/status` is readable: its peak RSS (`VmHWM`) is reset just before the change (writing
//! 5 to `/proc/<pid>/clear_refs`, see proc(5)) and read once the rollout is done. Checked: the peak grew
//! by less than 10 MiB over the RSS before, both new pods' handover gates say `Copied`, and at least
//! 95 % of the items are on their owner afterwards with the value they were stored with.
//!
//! The items are written and read straight to and from the pods' addresses, streamed (one item's value
//! in memory at a time), so this needs the pod IPs reachable from here, as the operator's copies do: on
//! a stand-in kubelet's node they are. Elsewhere the step says so and checks nothing.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use memcached_operator::hashing::{Placement, Scheme};
use serde_json::Value;

use crate::env::{E2e, OpInfo, delete_instance};
use crate::events::holder_contains;
use crate::handover::{check_gates, pod, reachable, settled, uids};
use crate::kubectl::{apply_yaml_ok, compact};
use crate::names::{API_VERSION, PORT};

const NAME: &str = "memcached-handover-memory";
const SIZE: usize = 2;
/// `maxMemoryMB` before and after the change (the change is what rolls the pods).
const MEMORY_MB: (u32, u32) = (800, 801);
/// Bytes of each item's value.
const VALUE_LEN: usize = 100 * 1024;
/// Items stored: the fewest of `VALUE_LEN` bytes that make 1 GiB.
const ITEMS: usize = (1 << 30) / VALUE_LEN + 1;
/// Items per pipelined multi-key `get`.
const GET_BATCH: usize = 16;
/// The most the operator's peak RSS may grow by while it hands the cache over.
const MAX_GROWTH_KIB: u64 = 10 * 1024;
const MIB: f64 = 1024.0 * 1024.0;

fn instance(ns: &str, memory_mb: u32) -> String {
    format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {NAME}\n  namespace: {ns}\n\
         spec:\n  size: {SIZE}\n  workload: Deployment\n  memcached:\n    maxMemoryMB: {memory_mb}\n"
    )
}

fn key(i: usize) -> String {
    format!("e2e-memory-{i:05}")
}

/// The value of item `i`: its key repeated to `VALUE_LEN` bytes, so a value read back under another
/// key, or cut short, does not compare equal.
fn value(i: usize) -> Vec<u8> {
    let key = key(i);
    let mut value = key.repeat(VALUE_LEN / key.len() + 1).into_bytes();
    value.truncate(VALUE_LEN);
    value
}

/// The items by the slot that owns them among `count` slots (jump hash over the slot order).
fn placed(count: usize) -> Vec<Vec<usize>> {
    let slots: Vec<String> = (0..count)
        .map(|slot| format!("slot-{slot}:{PORT}"))
        .collect();
    let placement = Placement::new(Scheme::Jump, &slots).expect("host:port entries");
    let mut by_slot = vec![Vec::new(); count];
    for i in 0..ITEMS {
        by_slot[placement.server(key(i).as_bytes()).expect("a slot")].push(i);
    }
    by_slot
}

/// The memcached address of each slot's pod, in slot order.
fn addresses(ns: &str, slots: &[(usize, String)]) -> Vec<SocketAddr> {
    let port = u16::try_from(PORT).unwrap_or(11211);
    slots
        .iter()
        .map(|(_, name)| {
            let pod = pod(ns, NAME, name);
            let ip: IpAddr = pod["status"]["podIP"]
                .as_str()
                .and_then(|ip| ip.parse().ok())
                .unwrap_or_else(|| panic!("pod {name} has no IP: {}", compact(&pod["status"])));
            SocketAddr::new(ip, port)
        })
        .collect()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let timeout = Duration::from_secs(30);
    let stream = TcpStream::connect_timeout(&addr, timeout)
        .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .unwrap_or_else(|e| panic!("{addr}: {e}"));
    stream
}

/// Stores every item on the server of its slot (`set ... noreply`, streamed through a small buffer),
/// then checks with `stats` that each server holds all of its items.
fn fill(servers: &[SocketAddr]) {
    for (addr, items) in servers.iter().zip(placed(servers.len())) {
        let stream = connect(*addr);
        let mut out = BufWriter::with_capacity(1 << 20, &stream);
        for &i in &items {
            write!(out, "set {} 0 0 {VALUE_LEN} noreply\r\n", key(i))
                .and_then(|()| out.write_all(&value(i)))
                .and_then(|()| out.write_all(b"\r\n"))
                .unwrap_or_else(|e| panic!("writing to {addr}: {e}"));
        }
        out.flush()
            .unwrap_or_else(|e| panic!("writing to {addr}: {e}"));
        drop(out);
        // `stats` is answered after every set before it on the connection was done.
        let stored = curr_items(&stream, *addr);
        assert_eq!(
            stored,
            items.len(),
            "{addr} holds {stored} of the {} items written to it (evicted or refused?)",
            items.len()
        );
    }
}

/// `curr_items` from the `stats` of the server on `stream`.
fn curr_items(mut stream: &TcpStream, addr: SocketAddr) -> usize {
    stream
        .write_all(b"stats\r\n")
        .unwrap_or_else(|e| panic!("writing to {addr}: {e}"));
    let mut curr = None;
    for line in BufReader::new(stream).lines() {
        let line = line.unwrap_or_else(|e| panic!("reading stats from {addr}: {e}"));
        if line == "END" {
            break;
        }
        if let Some(n) = line.strip_prefix("STAT curr_items ") {
            curr = n.trim().parse().ok();
        }
    }
    curr.unwrap_or_else(|| panic!("no curr_items in the stats of {addr}"))
}

/// How many items the server of their slot holds with the value they were stored with (read in
/// multi-key `get`s, one value in memory at a time).
fn hits(servers: &[SocketAddr]) -> usize {
    let mut hits = 0;
    let mut data = vec![0; VALUE_LEN + 2];
    for (addr, items) in servers.iter().zip(placed(servers.len())) {
        let stream = connect(*addr);
        let mut reader = BufReader::new(&stream);
        for batch in items.chunks(GET_BATCH) {
            let names: Vec<String> = batch.iter().map(|&i| key(i)).collect();
            (&stream)
                .write_all(format!("get {}\r\n", names.join(" ")).as_bytes())
                .unwrap_or_else(|e| panic!("writing to {addr}: {e}"));
            loop {
                let mut line = String::new();
                reader
                    .read_line(&mut line)
                    .unwrap_or_else(|e| panic!("reading from {addr}: {e}"));
                if line == "END\r\n" {
                    break;
                }
                // VALUE <key> <flags> <bytes>
                let parts: Vec<&str> = line.split_whitespace().collect();
                let (Some(&"VALUE"), Some(name), Some(Ok(len))) =
                    (parts.first(), parts.get(1), parts.get(3).map(|n| n.parse()))
                else {
                    panic!("{addr} answered a get with {line:?}");
                };
                data.resize(len + 2, 0);
                reader
                    .read_exact(&mut data)
                    .unwrap_or_else(|e| panic!("reading a value from {addr}: {e}"));
                let i = name["e2e-memory-".len()..].parse().unwrap_or(usize::MAX);
                if i < ITEMS && data[..len] == value(i)[..] {
                    hits += 1;
                }
            }
        }
    }
    hits
}

/// (`VmRSS`, `VmHWM`) of process `pid`, in KiB, from `/proc/<pid>/status`.
fn resident_kib(pid: u32) -> (u64, u64) {
    let path = format!("/proc/{pid}/status");
    let status =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in {path}"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets the peak RSS (`VmHWM`) of process `pid` to its current RSS (proc(5), `clear_refs`).
fn reset_peak(pid: u32) {
    let path = format!("/proc/{pid}/clear_refs");
    std::fs::write(&path, "5")
        .unwrap_or_else(|e| panic!("cannot reset the peak RSS ({path}): {e}"));
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

pub fn step_handover_memory(env: &E2e, op: &OpInfo) {
    let ns = env.ns.as_str();
    let (before_mb, after_mb) = MEMORY_MB;
    apply_yaml_ok(&instance(ns, before_mb));
    let before = settled(env, NAME, SIZE, &BTreeSet::new());
    let pods: Vec<Value> = before.iter().map(|(_, p)| pod(ns, NAME, p)).collect();
    if !pods.iter().all(reachable) {
        eprintln!(
            "    NOTE: SKIPPED: the pod IPs are not reachable from this machine, where the operator runs: \
             there is no copy to measure, and no way to fill the servers from here"
        );
        delete_instance(env, NAME);
        return;
    }
    let old = addresses(ns, &before);
    let started = Instant::now();
    fill(&old);
    let bytes = ITEMS * VALUE_LEN;
    eprintln!(
        "    stored {ITEMS} items of {VALUE_LEN} bytes ({:.2} GiB) on {old:?} in {:.1} s",
        bytes as f64 / MIB / 1024.0,
        started.elapsed().as_secs_f64()
    );

    let replaced = uids(ns, NAME).unwrap_or_else(|e| panic!("{e}"));
    // Only the leader copies: measuring another process would prove nothing.
    holder_contains(&op.identity).unwrap_or_else(|e| panic!("operator '{}' leads: {e}", op.label));
    reset_peak(op.pid);
    let (rss_before, _) = resident_kib(op.pid);
    eprintln!(
        "    operator '{}' (pid {}) RSS {:.1} MiB; changing maxMemoryMB {before_mb} -> {after_mb} (a rollout)",
        op.label,
        op.pid,
        mib(rss_before)
    );
    apply_yaml_ok(&instance(ns, after_mb));
    let started = Instant::now();
    let after = settled(env, NAME, SIZE, &replaced);
    let took = started.elapsed();
    let (rss_after, peak) = resident_kib(op.pid);
    let copies = check_gates(ns, NAME, &after, "Copied");

    let started = Instant::now();
    let read = hits(&addresses(ns, &after));
    let grew = peak.saturating_sub(rss_before);
    eprintln!(
        "    rollout done in {:.1} s: {copies:#?}\n    {read} of {ITEMS} items read back with their value in \
         {:.1} s; operator RSS before {:.1} MiB, peak {:.1} MiB (+{:.1} MiB), after {:.1} MiB",
        took.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        mib(rss_before),
        mib(peak),
        mib(grew),
        mib(rss_after)
    );
    assert!(
        read * 100 >= ITEMS * 95,
        "{read} of {ITEMS} items on their owner after the rollout"
    );
    assert!(
        grew < MAX_GROWTH_KIB,
        "the operator's peak RSS grew by {:.1} MiB handing over {:.2} GiB",
        mib(grew),
        bytes as f64 / MIB / 1024.0
    );
    eprintln!(
        "    ok: the operator's peak RSS grew by {:.1} MiB (< {} MiB) handing over 1 GiB",
        mib(grew),
        MAX_GROWTH_KIB / 1024
    );
    delete_instance(env, NAME);
}
