//! What both kinds of preamble share (the cluster secret's in `membership`, a named user's in
//! `users`): nonces and the errors a connector reports.

use std::fmt;
use std::io;

use stratus_env::Entropy;
use stratus_wire::membership::{MemberNonce, MEMBER_NONCE_BYTES};

/// 32 bytes from `nonces`.
pub(crate) fn draw_nonce(nonces: &dyn Entropy) -> MemberNonce {
    let mut nonce = [0u8; MEMBER_NONCE_BYTES];
    for chunk in nonce.chunks_exact_mut(8) {
        chunk.copy_from_slice(&nonces.next_u64().to_le_bytes());
    }
    nonce
}

/// A preamble message that could not be parsed.
pub(crate) fn invalid_data(error: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("membership preamble: {error}"))
}

/// A refusal, in words.
pub(crate) fn denied(reason: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("authentication: {reason}"))
}
