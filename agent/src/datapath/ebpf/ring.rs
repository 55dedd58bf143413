//! The one drain of an eBPF ring buffer: wait until the ring's fd is
//! readable (tokio's `AsyncFd`), read records with `next()` until one is
//! taken or the ring is empty, and only then clear the readiness, so no
//! record written before the wake-up is left waiting for the next one.
//!
//! What a record means is the caller's: [`Ring::recv`] hands each record's
//! bytes to a closure that returns `Some` for a record it takes and `None`
//! for one it skips (a malformed record, counted by the caller).

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use super::{EbpfDatapathError, Result};

/// A ring buffer registered with the tokio reactor.
pub(super) struct Ring {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl Ring {
    /// Registers `ring` with the reactor.
    pub(super) fn new(ring: RingBuf<MapData>) -> Result<Self> {
        Ok(Self {
            // SAFETY: the RingBuf owns its map fd and keeps it open for as
            // long as the AsyncFd holds it; nothing else closes or replaces it.
            ring: unsafe { AsyncFd::register(ring) }.map_err(|e| EbpfDatapathError::Poll {
                source: e.into_parts().1,
            })?,
        })
    }

    /// Waits for the next record `take` takes; records it skips are
    /// consumed.
    pub(super) async fn recv<T>(&mut self, mut take: impl FnMut(&[u8]) -> Option<T>) -> Result<T> {
        loop {
            if let Some(v) = drain(self.ring.get_mut(), &mut take) {
                return Ok(v);
            }
            let mut ready = self
                .ring
                .readable_mut()
                .await
                .map_err(|source| EbpfDatapathError::Poll { source })?;
            if let Some(v) = drain(ready.get_inner_mut(), &mut take) {
                return Ok(v);
            }
            // Empty: wait for the next wake-up.
            ready.clear_ready();
        }
    }

    /// The next record `take` takes already in the ring, without waiting.
    pub(super) fn try_recv<T>(&mut self, mut take: impl FnMut(&[u8]) -> Option<T>) -> Option<T> {
        drain(self.ring.get_mut(), &mut take)
    }
}

/// Reads records until `take` takes one (returned) or the ring is empty.
fn drain<T>(ring: &mut RingBuf<MapData>, take: &mut impl FnMut(&[u8]) -> Option<T>) -> Option<T> {
    while let Some(item) = ring.next() {
        if let Some(v) = take(&item) {
            return Some(v);
        }
    }
    None
}
