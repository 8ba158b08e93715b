//! A trial's full state as bytes: for swapping and checkpoints.
//!
//! Floats are stored as their exact bits, so an imported trial continues
//! bit-exactly. A fingerprint of the group shape refuses a state taken from
//! a different model.

use crate::error::{Result, WorkerError};
use crate::group::SlotState;

/// Version 2 adds batch norm's running statistics; version 1 states
/// (which have none) are still read.
const MAGIC: &[u8; 8] = b"SALUSTS2";
const MAGIC_V1: &[u8; 8] = b"SALUSTS1";

/// Everything needed to continue a trial exactly where it stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialSnapshot {
    /// Identifies the model shape and optimizer layout.
    pub fingerprint: u64,
    /// Iterations done.
    pub iteration: u64,
    /// Reports made so far.
    pub reports: u64,
    pub slot: SlotState,
}

impl TrialSnapshot {
    /// Bytes of floats the state holds.
    pub fn float_bytes(&self) -> usize {
        4 * (self.slot.params.len()
            + self.slot.opt_state.iter().map(Vec::len).sum::<usize>()
            + self.slot.train_stats.len()
            + self.slot.running.len())
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let s = &self.slot;
        let mut out = Vec::with_capacity(64 + self.float_bytes());
        out.extend_from_slice(MAGIC);
        for v in [
            self.fingerprint,
            self.iteration,
            self.reports,
            s.params.len() as u64,
            s.opt_state.len() as u64,
            s.train_stats.len() as u64,
            s.running.len() as u64,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for vec in std::iter::once(&s.params)
            .chain(&s.opt_state)
            .chain([&s.train_stats, &s.running])
        {
            vec.iter()
                .for_each(|f| out.extend_from_slice(&f.to_le_bytes()));
        }
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = |m: &str| WorkerError::BadState(m.to_string());
        let header = match bytes.get(..8) {
            Some(m) if m == MAGIC => 64,
            Some(m) if m == MAGIC_V1 => 56,
            _ => return Err(bad("not a salus-tune trial state (magic mismatch)")),
        };
        if bytes.len() < header {
            return Err(bad("truncated header"));
        }
        let word = |i: usize| u64::from_le_bytes(bytes[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        let (fingerprint, iteration, reports) = (word(0), word(1), word(2));
        let (n, n_state, n_stats) = (word(3) as usize, word(4) as usize, word(5) as usize);
        let n_running = if header == 64 { word(6) as usize } else { 0 };
        if n_state > 8 || n_stats > 64 {
            return Err(bad("implausible header"));
        }
        let floats = n
            .checked_mul(n_state + 1)
            .and_then(|v| v.checked_add(n_stats))
            .and_then(|v| v.checked_add(n_running))
            .ok_or_else(|| bad("size overflow"))?;
        let body = &bytes[header..];
        if body.len() != floats.checked_mul(4).ok_or_else(|| bad("size overflow"))? {
            return Err(bad("length does not match the header"));
        }
        let mut vals = body
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()));
        let mut take = |len: usize| vals.by_ref().take(len).collect::<Vec<f32>>();
        let params = take(n);
        let opt_state = (0..n_state).map(|_| take(n)).collect();
        let train_stats = take(n_stats);
        let running = take(n_running);
        Ok(TrialSnapshot {
            fingerprint,
            iteration,
            reports,
            slot: SlotState {
                params,
                opt_state,
                train_stats,
                running,
            },
        })
    }
}

/// FNV-1a, stable across runs and builds, for fingerprints.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}
