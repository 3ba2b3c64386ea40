//! Renders in a worker process of their own, bounded in memory and time.
//!
//! Fuel, depth and the output cap bound a render from inside, but not the size of the values it
//! builds: `{% set ns.s = ns.s ~ ns.s %}` doubles a string in one instruction, and so do `+`,
//! `replace` and a captured block, with no hook in minijinja for any of them. jinja2's sandbox
//! documentation leaves the same to the operating system, and so does this module.
//!
//! A template's first render `fork`s a worker, which inherits the compiled template in the pages
//! it shares copy-on-write with its parent; `RLIMIT_DATA` caps what it may allocate beyond what
//! it inherited, so a runaway value ends it with an allocation failure. It then serves renders
//! over a socket pair, a frame (length, then bytes) each way, until its parent closes the socket;
//! the parent kills it past the time limit. A worker that breached a limit is gone, and the next
//! render starts another. A fork copies the page tables of all the parent holds, a cost that grows
//! with the loaded model (docs/benchmarks.md), which is why one worker serves every render
//! instead of a fork each.
//!
//! A forked child of a threaded process has only the forking thread, so a lock another thread
//! held at the fork stays held in the worker. Rendering takes none of the process's locks but
//! the allocator's, which glibc resets in the child; were one ever taken, the worker would hang
//! and the time limit end it. The worker leaves by `_exit`, running no destructor and flushing
//! no buffer of its parent's.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Why a sandboxed call gave no reply.
#[derive(Debug)]
pub(super) enum Breach {
    /// It ran past its time limit, and its worker was killed.
    Time,
    /// Its worker ended before replying: by this signal (an allocation past the memory limit
    /// aborts) or with this status.
    Ended(Ending),
    /// The sandbox itself failed: no socket, no process.
    Io(io::Error),
}

/// How a worker that gave no reply ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ending {
    Signal(i32),
    Status(i32),
}

/// The status a worker exits with when its work panicked or its limit could not be set.
const FAILED: i32 = 101;

/// One worker, started on the first call and again after a breach; calls take turns.
#[derive(Debug, Default)]
pub(super) struct Sandbox {
    worker: Mutex<Option<Worker>>,
}

impl Sandbox {
    /// Runs `work` on `request` in the worker, within `memory` bytes more than the worker
    /// inherited and `time`. `work` is what a worker started by this call runs on every request
    /// it is sent, so it must be the same for every call.
    pub(super) fn call(
        &self,
        request: &[u8],
        work: &dyn Fn(&[u8]) -> Vec<u8>,
        memory: usize,
        time: Duration,
    ) -> Result<Vec<u8>, Breach> {
        let mut slot = self.worker.lock().unwrap_or_else(PoisonError::into_inner);
        let worker = match slot.take().filter(Worker::is_ours) {
            Some(worker) => worker,
            None => Worker::start(work, memory)?,
        };
        match worker.exchange(request, Instant::now() + time) {
            Ok(Some(reply)) => {
                *slot = Some(worker);
                Ok(reply)
            }
            Ok(None) => Err(Breach::Ended(worker.stop().map_err(Breach::Io)?)),
            Err(breach) => Err(breach),
        }
    }
}

/// A worker process and this process's end of its socket.
#[derive(Debug)]
struct Worker {
    pid: libc::pid_t,
    /// The process that started it: a process forked from that one inherits this value, but not
    /// the worker as its child.
    parent: u32,
    socket: UnixStream,
}

impl Worker {
    fn start(work: &dyn Fn(&[u8]) -> Vec<u8>, memory: usize) -> Result<Self, Breach> {
        let (ours, theirs) = UnixStream::pair().map_err(Breach::Io)?;
        // SAFETY: the child runs `serve` alone, which never returns; the parent goes on as before.
        match unsafe { libc::fork() } {
            -1 => Err(Breach::Io(io::Error::last_os_error())),
            0 => {
                drop(ours);
                serve(theirs, work, memory)
            }
            pid => Ok(Worker {
                pid,
                parent: std::process::id(),
                socket: ours,
            }),
        }
    }

    fn is_ours(&self) -> bool {
        self.parent == std::process::id()
    }

    /// Sends `request` and reads the reply by `deadline`; `None` where the worker closed its
    /// socket first (it died).
    fn exchange(&self, request: &[u8], deadline: Instant) -> Result<Option<Vec<u8>>, Breach> {
        if send_frame(&self.socket, request).is_err() {
            return Ok(None);
        }
        match read_frame(&self.socket, deadline) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(Breach::Time)
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(Breach::Io(e)),
            Ok(reply) => Ok(Some(reply)),
        }
    }

    /// Kills the worker (if it still lives) and says how it ended.
    fn stop(mut self) -> io::Result<Ending> {
        let ending = self.kill();
        std::mem::forget(self);
        ending
    }

    fn kill(&mut self) -> io::Result<Ending> {
        // SAFETY: `pid` is this process's child, not yet reaped (only `kill` reaps it).
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        reap(self.pid)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.is_ours() {
            let _ = self.kill();
        }
    }
}

/// The worker's whole life: limits, then `work` on each request until the socket closes.
fn serve(socket: UnixStream, work: &dyn Fn(&[u8]) -> Vec<u8>, memory: usize) -> ! {
    silence_stderr();
    close_other_descriptors(socket.as_raw_fd());
    if cap_memory(memory).is_err() {
        exit(FAILED);
    }
    let never = Instant::now() + Duration::from_secs(u32::MAX.into());
    while let Ok(request) = read_frame(&socket, never) {
        let Ok(reply) = catch_unwind(AssertUnwindSafe(|| work(&request))) else {
            exit(FAILED);
        };
        if send_frame(&socket, &reply).is_err() {
            break;
        }
    }
    exit(0)
}

fn exit(status: i32) -> ! {
    // SAFETY: ends this process at once, as a forked child of a threaded process must.
    unsafe { libc::_exit(status) }
}

/// Sends the worker's stderr to /dev/null: an allocation past the limit prints "memory
/// allocation failed" before aborting, which is the parent's to report.
fn silence_stderr() {
    // SAFETY: plain system calls on descriptors this function owns.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
        if null >= 0 {
            libc::dup2(null, libc::STDERR_FILENO);
            libc::close(null);
        }
    }
}

/// Closes every descriptor above stderr but `keep`: another worker's socket inherited here
/// would otherwise outlive its parent's end, and a served client's connection with it.
fn close_other_descriptors(keep: i32) {
    let ranges = [(3, keep - 1), (keep + 1, i32::MAX)];
    for (first, last) in ranges.into_iter().filter(|(first, last)| first <= last) {
        // SAFETY: closes descriptors no code in this process uses; a kernel without close_range
        // (before 5.9) leaves them open, which only keeps those sockets open longer.
        unsafe { libc::syscall(libc::SYS_close_range, first as u32, last as u32, 0) };
    }
}

/// Lets this process's private memory grow by `memory` bytes from what it holds now.
fn cap_memory(memory: usize) -> io::Result<()> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    // The sixth field: data and stack pages, what RLIMIT_DATA counts.
    let pages: u64 = (statm.split_whitespace().nth(5))
        .and_then(|pages| pages.parse().ok())
        .ok_or_else(|| io::Error::other("unexpected /proc/self/statm"))?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to fill and then read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_DATA, &mut limit) != 0 {
            return Err(io::Error::last_os_error());
        }
        limit.rlim_cur = (pages * page + memory as u64).min(limit.rlim_max);
        if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Writes `bytes`' length, then `bytes`; a closed peer is an error, not a SIGPIPE.
fn send_frame(socket: &UnixStream, bytes: &[u8]) -> io::Result<()> {
    let length = (bytes.len() as u64).to_le_bytes();
    send_all(socket, &length)?;
    send_all(socket, bytes)
}

fn send_all(socket: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: sends from a live slice on an open socket.
        let sent = unsafe {
            libc::send(
                socket.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        match sent {
            n if n >= 0 => bytes = &bytes[n as usize..],
            _ => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::Interrupted => {}
                e => return Err(e),
            },
        }
    }
    Ok(())
}

/// Reads one frame by `deadline`: `UnexpectedEof` where the peer closed first, `WouldBlock` or
/// `TimedOut` where the deadline came first.
fn read_frame(socket: &UnixStream, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut length = [0; 8];
    read_by(socket, &mut length, deadline)?;
    let length = usize::try_from(u64::from_le_bytes(length))
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    let mut frame = vec![0; length];
    read_by(socket, &mut frame, deadline)?;
    Ok(frame)
}

fn read_by(mut socket: &UnixStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        socket.set_read_timeout(Some(left))?;
        match socket.read(&mut buf[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits for the worker to end and says how.
fn reap(pid: libc::pid_t) -> io::Result<Ending> {
    let mut status = 0;
    // SAFETY: waits for this process's own child, writing its status into `status`.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(if libc::WIFSIGNALED(status) {
        Ending::Signal(libc::WTERMSIG(status))
    } else {
        Ending::Status(libc::WEXITSTATUS(status))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// Replies with `n` bytes counting up, where the request is `n` as text; allocates `n` bytes
    /// 64 times over where it is "hold n".
    fn work(request: &[u8]) -> Vec<u8> {
        let request = std::str::from_utf8(request).unwrap();
        if let Some(n) = request.strip_prefix("hold ") {
            let n: usize = n.parse().unwrap();
            let held: Vec<Vec<u8>> = (0..64).map(|_| vec![1; n]).collect();
            return held.iter().map(|v| v[n / 2]).collect();
        }
        if request == "spin" {
            loop {
                std::hint::spin_loop();
            }
        }
        if request == "panic" {
            panic!("in the worker");
        }
        let n: usize = request.parse().unwrap();
        (0..=255).cycle().take(n).collect()
    }

    fn call(sandbox: &Sandbox, request: &str, time: Duration) -> Result<Vec<u8>, Breach> {
        sandbox.call(request.as_bytes(), &work, 256 * MIB, time)
    }

    fn pid(sandbox: &Sandbox) -> libc::pid_t {
        sandbox.worker.lock().unwrap().as_ref().unwrap().pid
    }

    #[test]
    fn one_worker_serves_calls_and_replies_longer_than_a_socket_holds() {
        let sandbox = Sandbox::default();
        let reply = call(&sandbox, &(5 * MIB).to_string(), ENOUGH).unwrap();
        assert_eq!(reply.len(), 5 * MIB);
        assert!(reply.iter().enumerate().all(|(i, &b)| b == i as u8));
        let first = pid(&sandbox);
        assert_eq!(call(&sandbox, "3", ENOUGH).unwrap(), [0, 1, 2]);
        assert_eq!(pid(&sandbox), first);
    }

    /// 64 x 16 MiB is past 256 MiB: the worker dies of it, the caller is told, and the next
    /// call gets a new worker. 64 x 1 MiB is within it.
    #[test]
    fn an_allocation_past_the_memory_limit_ends_the_worker_not_the_caller() {
        let sandbox = Sandbox::default();
        let breach = call(&sandbox, &format!("hold {}", 16 * MIB), ENOUGH).unwrap_err();
        assert!(
            matches!(breach, Breach::Ended(Ending::Signal(libc::SIGABRT))),
            "{breach:?}"
        );
        let reply = call(&sandbox, &format!("hold {MIB}"), ENOUGH).unwrap();
        assert_eq!(reply, vec![1; 64]);
    }

    #[test]
    fn a_worker_past_its_time_is_killed_and_replaced() {
        let sandbox = Sandbox::default();
        let breach = call(&sandbox, "spin", Duration::from_millis(300));
        assert!(matches!(breach, Err(Breach::Time)), "{breach:?}");
        assert_eq!(call(&sandbox, "2", ENOUGH).unwrap(), [0, 1]);
    }

    #[test]
    fn a_panic_in_the_worker_stays_there() {
        let sandbox = Sandbox::default();
        let breach = call(&sandbox, "panic", ENOUGH).unwrap_err();
        assert!(
            matches!(breach, Breach::Ended(Ending::Status(FAILED))),
            "{breach:?}"
        );
    }

    const ENOUGH: Duration = Duration::from_secs(10);
}
