//! The copy's three connections: opening them, one request's time limit, the lines read back, and the
//! server's clock.

use std::future::Future;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use super::super::bounds::Settings;
use super::super::error::{CopyError, Side};
use crate::connection::{self, LINE_REPLY_LIMIT, Stream, Target, classify};

/// The most a `stats` reply is read for (the `time` line).
const STATS_LIMIT: u64 = 64 * 1024;

pub(super) type Conn = BufReader<Stream>;

/// Runs `future` within the request timeout, as a stall of `side` when it does not finish.
pub(super) async fn bounded<T>(
    settings: &Settings,
    side: Side,
    future: impl Future<Output = Result<T, CopyError>>,
) -> Result<T, CopyError> {
    tokio::time::timeout(settings.request_timeout, future)
        .await
        .unwrap_or(Err(CopyError::Stalled {
            side,
            after: settings.request_timeout,
        }))
}

pub(super) async fn open(
    settings: &Settings,
    side: Side,
    target: &Target,
) -> Result<Conn, CopyError> {
    bounded(settings, side, async {
        connection::open(target)
            .await
            .map(|connection| connection.stream)
            .map_err(|error| CopyError::Link { side, error })
    })
    .await
}

pub(super) fn link(side: Side) -> impl Fn(std::io::Error) -> CopyError {
    move |error| CopyError::Link {
        side,
        error: classify(error),
    }
}

pub(super) async fn send(conn: &mut Conn, side: Side, bytes: &[u8]) -> Result<(), CopyError> {
    connection::send(conn, bytes)
        .await
        .map_err(|error| CopyError::Link { side, error })
}

/// Reads one line of at most `limit` bytes into `line`; the connection closing first is an error.
pub(super) async fn read_line(
    conn: &mut Conn,
    side: Side,
    line: &mut Vec<u8>,
    limit: u64,
) -> Result<(), CopyError> {
    line.clear();
    let read = (&mut *conn)
        .take(limit)
        .read_until(b'\n', line)
        .await
        .map_err(link(side))?;
    if read == 0 {
        return Err(CopyError::Link {
            side,
            error: connection::LinkError::Closed,
        });
    }
    if !line.ends_with(b"\n") {
        return Err(CopyError::Protocol {
            side,
            answer: connection::shown(line),
        });
    }
    Ok(())
}

/// The server's clock (`stats` `time`), which is what item expiry times are on.
pub(super) async fn server_time(
    conn: &mut Conn,
    side: Side,
    line: &mut Vec<u8>,
) -> Result<i64, CopyError> {
    send(conn, side, b"stats\r\n").await?;
    let mut time = None;
    let mut read = 0;
    loop {
        read_line(conn, side, line, LINE_REPLY_LIMIT).await?;
        read += line.len() as u64;
        if line == b"END\r\n" {
            break;
        }
        if !line.starts_with(b"STAT ") || read > STATS_LIMIT {
            return Err(CopyError::Protocol {
                side,
                answer: connection::shown(line),
            });
        }
        if let Some(value) = line.strip_prefix(b"STAT time ") {
            time = std::str::from_utf8(value)
                .ok()
                .and_then(|text| text.trim_end().parse().ok());
        }
    }
    time.ok_or_else(|| CopyError::Protocol {
        side,
        answer: "a stats reply without time".to_owned(),
    })
}
