//! Low-level appenders for building a body in place, between [`crate::begin_response`] and
//! [`crate::finish_frame`]. The codec uses them too, so a body built by hand is byte-identical to
//! one built from a [`crate::Response`].
//!
//! Every integer is little-endian. The patch functions do nothing when the position is out of
//! range (a caller bug), rather than panic inside a server.

use bytes::BytesMut;
use stratus_types::Version;

/// Appends a u8.
pub fn put_u8(out: &mut BytesMut, value: u8) {
    out.extend_from_slice(&[value]);
}

/// Appends a little-endian u16.
pub fn put_u16(out: &mut BytesMut, value: u16) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Appends a little-endian u32.
pub fn put_u32(out: &mut BytesMut, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Appends a little-endian u64.
pub fn put_u64(out: &mut BytesMut, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Appends a little-endian two's-complement i64.
pub fn put_i64(out: &mut BytesMut, value: i64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Appends a version (u64).
pub fn put_version(out: &mut BytesMut, version: Version) {
    put_u64(out, version.0);
}

/// Appends a placeholder u32 length and returns its position; append the bytes, then call
/// [`finish_length_prefixed_u32`]. Lets a value of unknown length be streamed straight into the
/// frame (for example out of the log) without an intermediate buffer.
pub fn begin_length_prefixed_u32(out: &mut BytesMut) -> usize {
    let position = out.len();
    put_u32(out, 0);
    position
}

/// Patches the length written by [`begin_length_prefixed_u32`] at `position` to the number of
/// bytes appended since. Saturates at u32::MAX (such a frame is over the frame limit anyway, so
/// [`crate::finish_frame`] refuses it).
pub fn finish_length_prefixed_u32(out: &mut BytesMut, position: usize) {
    let start = position.saturating_add(4);
    let length = u32::try_from(out.len().saturating_sub(start)).unwrap_or(u32::MAX);
    patch_u32(out, position, length);
}

/// Overwrites the u32 at `position` (for example a count known only after the items).
pub fn patch_u32(out: &mut BytesMut, position: usize, value: u32) {
    patch(out, position, &value.to_le_bytes());
}

/// Overwrites the u64 at `position` (for example a version known only after the value was
/// copied).
pub fn patch_u64(out: &mut BytesMut, position: usize, value: u64) {
    patch(out, position, &value.to_le_bytes());
}

fn patch(out: &mut BytesMut, position: usize, bytes: &[u8]) {
    let end = position.saturating_add(bytes.len());
    if let Some(target) = out.get_mut(position..end) {
        target.copy_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_length_prefix_and_patches() {
        let mut out = BytesMut::new();
        put_u8(&mut out, 0xaa);
        let version_at = out.len();
        put_u64(&mut out, 0);
        let position = begin_length_prefixed_u32(&mut out);
        out.extend_from_slice(b"abc");
        finish_length_prefixed_u32(&mut out, position);
        patch_u64(&mut out, version_at, 0x0102);
        assert_eq!(&out[..], b"\xaa\x02\x01\0\0\0\0\0\0\x03\0\0\0abc");
        // Out-of-range positions are ignored, never a panic.
        patch_u64(&mut out, usize::MAX, 1);
        let near_end = out.len() - 2;
        patch_u32(&mut out, near_end, 1);
        finish_length_prefixed_u32(&mut out, usize::MAX);
        assert_eq!(&out[..], b"\xaa\x02\x01\0\0\0\0\0\0\x03\0\0\0abc");
    }
}
