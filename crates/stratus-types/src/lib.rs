//! Identifiers, limits and data-model rules shared by every Stratus crate.
//!
//! This crate is the bottom of the dependency graph: the client and every server crate depend on
//! it, it depends on nothing of ours. It holds only facts that both sides of the wire must agree
//! on: the newtype identifiers, the limits (one place, each with its reason), the key hash that
//! routes a key to a tablet, and the semantics of reject rules.

pub mod expiry;
pub mod hash;
pub mod ids;
pub mod limits;
pub mod reject;
pub mod rifl;
pub mod tablet;
pub mod tier;
pub mod tx;

pub use expiry::{ExpiresAt, Expiry};
pub use hash::{key_hash, IntegerHasher, IntegerHashing};
pub use ids::{KeyHash, SegmentId, ServerId, TableId, Version};
pub use reject::{RejectReason, RejectRules};
pub use rifl::{LeaseId, RpcId, RpcIdentity, RpcIdentityError};
pub use tablet::{HashRange, TabletState};
pub use tier::Tier;
pub use tx::{TxDecision, TxOpKind, TxVote};
