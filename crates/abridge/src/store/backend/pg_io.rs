//! A PostgreSQL connection's I/O done on the thread that waits for it
//! (Unix).
//!
//! tokio-postgres splits a connection in two: the `Client` that writes
//! requests into a channel, and the `Connection`, a future that moves them
//! to and from the socket. Spawned on a runtime of its own, every round
//! trip crosses threads three times: the caller wakes the I/O thread, the
//! server's answer wakes it again (epoll), and it wakes the caller. Here
//! the `Connection` is kept with its client and polled by the caller's own
//! wait, over a non-blocking socket: the caller writes the request itself,
//! sleeps in `poll(2)` on the socket, and the kernel wakes it when the
//! answer arrives, the way a synchronous client (libpq) waits.
//!
//! The socket's reads and writes answer "not yet" without registering a
//! waker: only [`block_on`] polls them, and it waits on the socket itself
//! before polling again. The `Connection` is polled only inside a wait,
//! so what the server sends between requests (a termination notice before
//! it closes the connection) is read with the next request, or by
//! [`Io::ended`] before a pooled connection is handed out.

use std::future::Future;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connected socket, non-blocking, read and written by whoever polls it.
pub(crate) struct Socket {
    inner: Inner,
    /// A write found the socket's buffer full: the wait also waits for it
    /// to be writable.
    want_write: Arc<AtomicBool>,
}

enum Inner {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Socket {
    pub(crate) fn tcp(s: std::net::TcpStream) -> io::Result<Socket> {
        s.set_nodelay(true)?;
        Socket::new(Inner::Tcp(s))
    }

    pub(crate) fn unix(s: std::os::unix::net::UnixStream) -> io::Result<Socket> {
        Socket::new(Inner::Unix(s))
    }

    fn new(inner: Inner) -> io::Result<Socket> {
        match &inner {
            Inner::Tcp(s) => s.set_nonblocking(true)?,
            Inner::Unix(s) => s.set_nonblocking(true)?,
        }
        Ok(Socket {
            inner,
            want_write: Arc::default(),
        })
    }

    /// What a wait needs to know of the socket.
    pub(crate) fn handle(&self) -> Handle {
        Handle {
            fd: match &self.inner {
                Inner::Tcp(s) => s.as_raw_fd(),
                Inner::Unix(s) => s.as_raw_fd(),
            },
            want_write: self.want_write.clone(),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.inner {
            Inner::Tcp(s) => s.read(buf),
            Inner::Unix(s) => s.read(buf),
        }
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.inner {
            Inner::Tcp(s) => s.write(buf),
            Inner::Unix(s) => s.write(buf),
        }
    }
}

/// "Not yet" for a socket that would block; an interrupted call again.
fn ready<T>(mut op: impl FnMut() -> io::Result<T>, blocked: impl FnOnce()) -> Poll<io::Result<T>> {
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                blocked();
                return Poll::Pending;
            }
            r => return Poll::Ready(r),
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let n = match ready(|| this.read(buf.initialize_unfilled()), || ()) {
            Poll::Ready(Ok(n)) => n,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        };
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let want = this.want_write.clone();
        ready(|| this.write(buf), || want.store(true, Ordering::Relaxed))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = match &self.inner {
            Inner::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
            Inner::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        };
        Poll::Ready(r.or_else(|e| match e.kind() {
            io::ErrorKind::NotConnected => Ok(()),
            _ => Err(e),
        }))
    }
}

/// A socket connected to `host` at `port`: a Unix socket in the host's
/// directory, or TCP to the first of the host's addresses that answers,
/// with the options tokio-postgres sets on its own (no Nagle delay,
/// keepalives as configured, the user timeout on Linux).
pub(crate) fn connect(
    c: &tokio_postgres::Config,
    host: &tokio_postgres::config::Host,
    port: u16,
    timeout: Duration,
) -> io::Result<Socket> {
    match host {
        tokio_postgres::config::Host::Tcp(name) => tcp_socket(c, name, port, timeout),
        tokio_postgres::config::Host::Unix(dir) => {
            std::os::unix::net::UnixStream::connect(dir.join(format!(".s.PGSQL.{port}")))
                .and_then(Socket::unix)
        }
    }
}

fn tcp_socket(
    c: &tokio_postgres::Config,
    name: &str,
    port: u16,
    timeout: Duration,
) -> io::Result<Socket> {
    use std::net::ToSocketAddrs;
    let mut last = None;
    for addr in (name, port).to_socket_addrs()? {
        match std::net::TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                let sock = socket2::SockRef::from(&s);
                if c.get_keepalives() {
                    let k = socket2::TcpKeepalive::new().with_time(c.get_keepalives_idle());
                    #[cfg(not(any(
                        target_os = "aix",
                        target_os = "redox",
                        target_os = "solaris",
                        target_os = "openbsd"
                    )))]
                    let k = match (c.get_keepalives_interval(), c.get_keepalives_retries()) {
                        (Some(i), Some(r)) => k.with_interval(i).with_retries(r),
                        (Some(i), None) => k.with_interval(i),
                        (None, Some(r)) => k.with_retries(r),
                        (None, None) => k,
                    };
                    sock.set_tcp_keepalive(&k)?;
                }
                #[cfg(target_os = "linux")]
                if let Some(t) = c.get_tcp_user_timeout() {
                    sock.set_tcp_user_timeout(Some(*t))?;
                }
                return Socket::tcp(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{name}: no address"))))
}

/// The socket's descriptor and its write flag, for a wait.
pub(crate) struct Handle {
    fd: RawFd,
    want_write: Arc<AtomicBool>,
}

/// The connection's future, polled by the waits of its client.
pub(crate) type Driven = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A client's I/O: its connection's future (None before it was made and
/// once it ended) and its socket.
pub(crate) struct Io {
    connection: Option<Driven>,
    socket: Handle,
    /// The connection ended (and closed its socket): the descriptor is
    /// not waited on again, whatever it may name by now.
    closed: bool,
}

impl Io {
    /// The I/O of `socket`, whose connection is not made yet.
    pub(crate) fn new(socket: Handle) -> Io {
        Io {
            connection: None,
            socket,
            closed: false,
        }
    }

    /// The connection made over the socket, polled by the waits from now.
    pub(crate) fn drive_from_now(&mut self, connection: Driven) {
        self.connection = Some(connection);
    }

    /// Whether the connection has ended: when the server has sent
    /// anything since the last request (a termination notice, the end of
    /// the stream), it is read now.
    pub(crate) fn ended(&mut self) -> bool {
        if self.connection.is_some() && self.socket.poll(false, Some(Duration::ZERO)) > 0 {
            self.push();
        }
        self.closed
    }

    /// Lets the connection write what its client has asked for so far
    /// (and read what has come), without waiting for anything.
    pub(crate) fn push(&mut self) {
        self.drive(&mut Context::from_waker(Waker::noop()));
    }

    /// Sleeps on the socket until it can be read (or written, when the
    /// connection's last write was refused), or `timeout` passed.
    fn sleep(&self, timeout: Option<Duration>) {
        let write = self.socket.want_write.swap(false, Ordering::Relaxed);
        self.socket.poll(write, timeout);
    }

    /// Polls the connection once; drops it when it ended.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(c) = self.connection.as_mut() {
            if c.as_mut().poll(cx).is_ready() {
                self.connection = None;
                self.closed = true;
            }
        }
    }
}

/// How long a dropped connection may wait to end its session: as a rule
/// `Terminate` is written at once and no wait happens; this bounds a socket
/// whose buffer is full or answers still owed by the server.
const END_WAIT: Duration = Duration::from_millis(100);

impl Drop for Io {
    /// Ends the session as tokio-postgres's own task does once its client
    /// is gone (the client is dropped first: [`super::pg::PgConn`]'s field
    /// order): the connection, polled until it ends, sends the server
    /// `Terminate` and shuts its socket, instead of the stream stopping.
    fn drop(&mut self) {
        let until = Instant::now() + END_WAIT;
        loop {
            self.push();
            if self.connection.is_none() {
                return;
            }
            let Ok(left) = until.left() else { return };
            self.sleep(left);
        }
    }
}

impl Handle {
    /// Sleeps until the socket is readable (or writable, when a write was
    /// refused), or `timeout` passed (None: no limit). How many descriptors
    /// are ready: 0 when the time ran out; an error counts as ready (the
    /// read or write that follows says what it was).
    fn poll(&self, write: bool, timeout: Option<Duration>) -> i32 {
        let mut events = libc::POLLIN;
        if write {
            events |= libc::POLLOUT;
        }
        let mut fd = libc::pollfd {
            fd: self.fd,
            events,
            revents: 0,
        };
        let ms = timeout.map_or(-1, |t| {
            i32::try_from(t.as_millis().max(u128::from(!t.is_zero()))).unwrap_or(i32::MAX)
        });
        loop {
            // SAFETY: one valid pollfd, for the duration of the call.
            let n = unsafe { libc::poll(&mut fd, 1, ms) };
            if n >= 0 {
                return n;
            }
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return 1;
            }
        }
    }
}

/// Set when a future asks to be polled again.
#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

/// When a wait gives up: never (`()`), or at an instant.
pub(crate) trait Deadline {
    /// What a wait returns when it gave up.
    type Missed;
    /// The time left (None: no limit), or the miss once it passed.
    fn left(&self) -> Result<Option<Duration>, Self::Missed>;
}

impl Deadline for () {
    type Missed = std::convert::Infallible;
    fn left(&self) -> Result<Option<Duration>, Self::Missed> {
        Ok(None)
    }
}

impl Deadline for Instant {
    type Missed = ();
    fn left(&self) -> Result<Option<Duration>, ()> {
        match self.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => Ok(Some(left)),
            _ => Err(()),
        }
    }
}

/// Waits for `f` on the calling thread, polling the connection (when there
/// is one) and sleeping on its socket between polls.
pub(crate) fn block_on<F: Future>(io: &mut Io, f: F) -> F::Output {
    match block_on_until(io, (), f) {
        Ok(v) => v,
        Err(never) => match never {},
    }
}

/// [`block_on`], given up at `deadline`.
pub(crate) fn block_on_until<F: Future, D: Deadline>(
    io: &mut Io,
    deadline: D,
    f: F,
) -> Result<F::Output, D::Missed> {
    let flag = Arc::new(Flag::default());
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        flag.0.store(false, Ordering::Release);
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Ok(v);
        }
        let had = io.connection.is_some();
        io.drive(&mut cx);
        if flag.0.load(Ordering::Acquire) || (had && io.connection.is_none()) {
            // Something was answered, or the connection ended (what waited
            // on it is answered: its channels closed): poll again.
            continue;
        }
        if io.closed {
            // Nothing reads the socket any more (its descriptor may name
            // another file by now): only a wake-up can answer `f`.
            return Ok(futures_executor::block_on(f));
        }
        io.sleep(deadline.left()?);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The wait sleeps on the socket until the other end writes, and a
    /// write the socket's buffer refuses goes on once the other end reads:
    /// no waker is needed, and nothing spins.
    #[test]
    fn a_wait_sleeps_on_the_socket_until_it_is_ready() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut sock = Socket::unix(a).unwrap();
        let mut io = Io::new(sock.handle());
        let peer = std::thread::spawn(move || {
            let mut b = b;
            std::thread::sleep(Duration::from_millis(50));
            b.write_all(b"ping").unwrap();
            // Read everything the other side writes, then say how much.
            let mut got = vec![0u8; 4 << 20];
            let mut n = 0;
            while n < got.len() {
                n += b.read(&mut got[n..]).unwrap();
            }
            n
        });
        let mut buf = [0u8; 4];
        let read = block_on(&mut io, sock.read_exact(&mut buf));
        assert_eq!(read.unwrap(), 4);
        assert_eq!(&buf, b"ping");
        // Far more than a socket's buffer holds: the write is refused,
        // waits until writable, and finishes.
        let big = vec![7u8; 4 << 20];
        block_on(&mut io, sock.write_all(&big)).unwrap();
        assert_eq!(peer.join().unwrap(), 4 << 20);
    }

    /// A deadline ends a wait on a socket nobody writes to.
    #[test]
    fn a_wait_with_a_deadline_ends_when_it_passes() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut sock = Socket::unix(a).unwrap();
        let mut io = Io::new(sock.handle());
        let mut buf = [0u8; 1];
        let deadline = Instant::now() + Duration::from_millis(30);
        assert!(block_on_until(&mut io, deadline, sock.read_exact(&mut buf)).is_err());
    }
}
