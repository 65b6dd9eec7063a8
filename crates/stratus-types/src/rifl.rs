//! Exactly-once operations (RIFL, docs/design/exactly-once.md): the identity a client gives
//! each mutation, so that a master applies it once however often it arrives, and answers a
//! retry with the first result.

use std::fmt;

/// A client's lease, granted by the coordinator: unique in the cluster's lifetime, never 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An RPC's id within its client's lease: allocated by the client, ascending from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RpcId(pub u64);

impl fmt::Display for RpcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What every mutation of an exactly-once client carries. Every retry of the mutation carries
/// the same `lease` and `rpc`; `acknowledged` may have grown since.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RpcIdentity {
    /// The client's lease.
    pub lease: LeaseId,
    /// This mutation's id (at least 1).
    pub rpc: RpcId,
    /// The client has the result of every RPC with an id at or below this one: a master may
    /// forget their results, and refuses them as stale if they arrive again.
    pub acknowledged: RpcId,
}

/// Why an [`RpcIdentity`] cannot be right, whatever the master holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcIdentityError {
    /// Lease 0 is never granted.
    ZeroLease,
    /// RPC ids start at 1.
    ZeroRpc,
    /// A client acknowledges only RPCs it has results of, never the one it is sending.
    AcknowledgesItself,
}

impl fmt::Display for RpcIdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RpcIdentityError::ZeroLease => "client lease 0 is never granted",
            RpcIdentityError::ZeroRpc => "rpc id 0 is never allocated",
            RpcIdentityError::AcknowledgesItself => {
                "an rpc cannot be acknowledged by its own request"
            }
        })
    }
}

impl RpcIdentity {
    /// Checks what can be checked without the master's records.
    pub fn validate(&self) -> Result<(), RpcIdentityError> {
        if self.lease.0 == 0 {
            return Err(RpcIdentityError::ZeroLease);
        }
        if self.rpc.0 == 0 {
            return Err(RpcIdentityError::ZeroRpc);
        }
        if self.acknowledged >= self.rpc {
            return Err(RpcIdentityError::AcknowledgesItself);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_that_cannot_be_right_are_refused() {
        let good = RpcIdentity { lease: LeaseId(3), rpc: RpcId(10), acknowledged: RpcId(9) };
        assert_eq!(good.validate(), Ok(()));
        assert_eq!(
            RpcIdentity { lease: LeaseId(0), ..good }.validate(),
            Err(RpcIdentityError::ZeroLease)
        );
        assert_eq!(
            RpcIdentity { rpc: RpcId(0), acknowledged: RpcId(0), ..good }.validate(),
            Err(RpcIdentityError::ZeroRpc)
        );
        assert_eq!(
            RpcIdentity { acknowledged: RpcId(10), ..good }.validate(),
            Err(RpcIdentityError::AcknowledgesItself)
        );
    }
}
