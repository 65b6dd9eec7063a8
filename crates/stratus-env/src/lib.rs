//! The environment: the only way Stratus services reach the network, the wall clock and
//! randomness.
//!
//! Services receive an [`Environment`] instead of calling `TcpStream::connect`,
//! `SystemTime::now` or a global random generator, so a deterministic simulator can hand them a
//! simulated network, clock and seeded randomness without any change to their code.
//!
//! Timers and the monotonic clock are `tokio::time`: a simulator runs the services on a
//! single-threaded runtime with paused time, where `tokio::time` is already virtual and
//! deterministic, so no second timer abstraction is needed.
//!
//! Disks are reached through their own narrow traits in the crates that own the formats
//! (`stratus-meta`'s `MetaStore`, and the backup storage of a later issue).

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// A boxed future, for object-safe async trait methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs `futures` concurrently on the current task and returns their outputs in order (no task
/// per future: on a loaded machine each spawn is a scheduling hop, and the futures may borrow
/// from the caller).
pub async fn join_all<T>(mut futures: Vec<BoxFuture<'_, T>>) -> Vec<T> {
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(context) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().map(|output| output.expect("every future completed")).collect()
}

/// The reading half of a connection.
pub type BoxReader = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a connection.
pub type BoxWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// An established byte-stream connection, already split into halves so a reader task and a
/// writer task can own one each without a lock between them.
pub struct Connection {
    /// Bytes from the peer.
    pub reader: BoxReader,
    /// Bytes to the peer.
    pub writer: BoxWriter,
    /// The peer's address, for logs.
    pub peer_address: String,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection").field("peer_address", &self.peer_address).finish()
    }
}

/// Writes all of `bytes` to `writer` and flushes it. Every message a peer must see before it
/// answers goes out this way: a writer that encrypts (TLS) may hold the tail of what it was
/// given until it is flushed, where a TCP writer sends at once and its flush does nothing.
pub async fn write_and_flush<W>(writer: &mut W, bytes: &[u8]) -> io::Result<()>
where
    W: AsyncWrite + Unpin + ?Sized,
{
    writer.write_all(bytes).await?;
    writer.flush().await
}

/// Reads exactly `bytes.len()` bytes: the first answer of a peer. When the peer closes first
/// after sending the start of a TLS record (an alert, or a server hello), the error says that
/// it speaks TLS and this side does not: the usual mistake of a client without a CA file
/// reaching a TLS port, which would otherwise read as a bare "early eof".
pub async fn read_first_answer<R>(reader: &mut R, bytes: &mut [u8]) -> io::Result<()>
where
    R: AsyncRead + Unpin + ?Sized,
{
    use tokio::io::AsyncReadExt;
    let mut received = 0;
    while received < bytes.len() {
        let read = reader.read(&mut bytes[received..]).await?;
        if read == 0 {
            // TLS record types: 21 alert, 22 handshake; then the major version, 3.
            let tls_record = received >= 2 && matches!(bytes[0], 21 | 22) && bytes[1] == 3;
            let reason = if tls_record {
                "the peer speaks TLS and closed: give this client the CA that signed its \
                 certificate (--tls-ca-file, STRATUS_TLS_CA_FILE)"
                    .to_string()
            } else {
                format!("the peer closed after {received} bytes of its answer")
            };
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, reason));
        }
        received += read;
    }
    Ok(())
}

/// Accepts incoming connections.
pub trait Listener: Send + fmt::Debug {
    /// The next incoming connection.
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Connection>>;
    /// The address actually bound ("host:port"), useful when binding port 0.
    fn local_address(&self) -> String;
}

/// Opens and accepts connections.
pub trait Network: Send + Sync + fmt::Debug + 'static {
    /// Connects to `address` ("host:port").
    fn connect<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Connection>>;
    /// Listens on `address` ("host:port"; port 0 picks a free port).
    fn bind<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Box<dyn Listener>>>;
}

/// Wall-clock time, used only for object timestamps and human-facing reports; all timeouts
/// use the monotonic `tokio::time`.
pub trait WallClock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch (objects' expiry times are in this unit).
    fn now_millis(&self) -> u64;

    /// Seconds since the Unix epoch (saturating at u32::MAX, in the year 2106).
    fn now_seconds(&self) -> u32 {
        u32::try_from(self.now_millis() / 1_000).unwrap_or(u32::MAX)
    }
}

/// A source of random numbers (backoff jitter, placement choices).
pub trait Entropy: Send + Sync + fmt::Debug + 'static {
    /// A uniformly distributed 64-bit number.
    fn next_u64(&self) -> u64;

    /// A number uniformly distributed in `0..bound` (bound > 0).
    fn below(&self, bound: u64) -> u64 {
        assert!(bound > 0, "empty range");
        // Multiply-shift keeps the bias below 2^-64 * bound, negligible for our uses.
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }
}

/// Everything a service needs from the outside world.
#[derive(Clone, Debug)]
pub struct Environment {
    /// The network.
    pub network: Arc<dyn Network>,
    /// The wall clock.
    pub wall_clock: Arc<dyn WallClock>,
    /// Randomness (jitter, placement): cheap, and predictable in production.
    pub entropy: Arc<dyn Entropy>,
    /// Randomness an attacker must not predict (authentication nonces): the kernel's source in
    /// production, seeded in the simulator (a run stays a function of its seed).
    pub secure_entropy: Arc<dyn Entropy>,
}

impl Environment {
    /// The real operating system: TCP, the system clock, randomness seeded from the clock and
    /// the process id, and the kernel's unpredictable source for nonces.
    pub fn system() -> Environment {
        Environment {
            network: Arc::new(TcpNetwork),
            wall_clock: Arc::new(SystemWallClock),
            entropy: Arc::new(SeededEntropy::new(system_seed())),
            secure_entropy: Arc::new(OsEntropy),
        }
    }
}

/// Runs CPU-heavy work (a metadata fsync, a segment replay, a replica's checksum pass) without
/// stalling the other tasks of a multi-threaded runtime: on tokio's blocking pool there, and
/// inline on a current-thread runtime. A current-thread runtime is what the deterministic
/// simulator runs every node on: handing work to another OS thread there would make the order
/// of events depend on the operating system's scheduler, and the run would no longer be
/// reproducible from its seed. (Single-threaded tests get the same inline behaviour.)
///
/// An error means the work panicked on the blocking pool.
pub async fn run_blocking<T, F>(work: F) -> Result<T, String>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let flavor = tokio::runtime::Handle::try_current().map(|handle| handle.runtime_flavor());
    match flavor {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
            tokio::task::spawn_blocking(work).await.map_err(|error| error.to_string())
        }
        _ => Ok(work()),
    }
}

/// TCP with `TCP_NODELAY` set on every connection: requests are small and latency-bound, and
/// the RPC layer batches writes itself.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpNetwork;

fn split_tcp(stream: tokio::net::TcpStream) -> io::Result<Connection> {
    stream.set_nodelay(true)?;
    let peer_address = stream.peer_addr().map(|address| address.to_string()).unwrap_or_default();
    let (reader, writer) = stream.into_split();
    Ok(Connection { reader: Box::new(reader), writer: Box::new(writer), peer_address })
}

impl Network for TcpNetwork {
    fn connect<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Connection>> {
        Box::pin(async move { split_tcp(tokio::net::TcpStream::connect(address).await?) })
    }

    fn bind<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            let listener = tokio::net::TcpListener::bind(address).await?;
            Ok(Box::new(TcpAcceptor { listener }) as Box<dyn Listener>)
        })
    }
}

#[derive(Debug)]
struct TcpAcceptor {
    listener: tokio::net::TcpListener,
}

impl Listener for TcpAcceptor {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Connection>> {
        Box::pin(async move {
            let (stream, _) = self.listener.accept().await?;
            split_tcp(stream)
        })
    }

    fn local_address(&self) -> String {
        self.listener.local_addr().map(|address| address.to_string()).unwrap_or_default()
    }
}

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemWallClock;

impl WallClock for SystemWallClock {
    fn now_millis(&self) -> u64 {
        let since_epoch =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
    }
}

/// SplitMix64's increment (the golden ratio in 64 bits).
const SPLIT_MIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output for the state after an increment.
fn split_mix_output(state: u64) -> u64 {
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64 for a single owner: the small deterministic generator of tests and benchmarks
/// (fast, so a benchmark does not measure its random numbers; seeded, so a run repeats).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub const fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(SPLIT_MIX_GAMMA);
        split_mix_output(self.0)
    }

    /// A number in `0..bound` (multiply-shift, no modulo bias worth naming); 0 when `bound`
    /// is 0.
    pub fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }
}

/// A deterministic generator (SplitMix64): the same seed gives the same sequence, which is what
/// the simulator needs; thread-safe through one atomic counter.
#[derive(Debug)]
pub struct SeededEntropy {
    state: AtomicU64,
}

impl SeededEntropy {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> SeededEntropy {
        SeededEntropy { state: AtomicU64::new(seed) }
    }
}

impl Entropy for SeededEntropy {
    fn next_u64(&self) -> u64 {
        let state = self.state.fetch_add(SPLIT_MIX_GAMMA, Ordering::Relaxed);
        split_mix_output(state.wrapping_add(SPLIT_MIX_GAMMA))
    }
}

/// The operating system's cryptographically secure random source (getrandom(2) on Linux): for
/// what an attacker must not predict, such as the nonces of the membership preamble. A
/// [`SeededEntropy`] seeded from the clock is fine for jitter and placement but predictable.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn next_u64(&self) -> u64 {
        // The kernel's source fails only before its pool is initialised at early boot, or when
        // the system call is blocked by a sandbox: a server cannot authenticate safely then.
        getrandom::u64().expect("the operating system's random source is unavailable")
    }
}

fn system_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|duration| duration.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_split_mix_generators_give_one_sequence_and_below_stays_below() {
        let shared = SeededEntropy::new(99);
        let mut owned = SplitMix64::new(99);
        for _ in 0..1_000 {
            assert_eq!(shared.next_u64(), owned.next_u64());
        }
        // SplitMix64's published first output for seed 0.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        for bound in [0, 1, 7, 1 << 40, u64::MAX] {
            for _ in 0..100 {
                let drawn = owned.below(bound);
                assert!(drawn < bound.max(1), "{drawn} of {bound}");
            }
        }
    }

    #[test]
    fn os_entropy_does_not_repeat() {
        let draws: std::collections::BTreeSet<u64> =
            (0..64).map(|_| OsEntropy.next_u64()).collect();
        assert_eq!(draws.len(), 64);
    }

    #[test]
    fn seeded_entropy_is_deterministic_and_bounded() {
        let first = SeededEntropy::new(7);
        let second = SeededEntropy::new(7);
        for _ in 0..100 {
            assert_eq!(first.next_u64(), second.next_u64());
        }
        for bound in [1u64, 2, 3, 1000] {
            for _ in 0..100 {
                assert!(first.below(bound) < bound);
            }
        }
    }

    #[tokio::test]
    async fn tcp_network_connects_to_its_listener() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let network = TcpNetwork;
        let mut listener = network.bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_address();
        let client = tokio::spawn(async move {
            let mut connection = TcpNetwork.connect(&address).await.unwrap();
            connection.writer.write_all(b"ping").await.unwrap();
        });
        let mut accepted = listener.accept().await.unwrap();
        let mut buffer = [0u8; 4];
        accepted.reader.read_exact(&mut buffer).await.unwrap();
        assert_eq!(&buffer, b"ping");
        client.await.unwrap();
    }
}
