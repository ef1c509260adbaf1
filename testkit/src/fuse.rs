//! A stalled file system, for tests of what a hung mount (an NFS server gone, a FUSE daemon
//! stopped) does to a worker: a tiny FUSE server on `/dev/fuse` (root only) whose one file can
//! be looked up and stat'ed, but whose opens are never answered. An `execve` of that file waits
//! in the kernel for as long as the file system lives, as it would on a stalled mount; dropping
//! the file system ends the connection, and every open waiting fails (ENOTCONN).
//!
//! The protocol is the kernel's (`include/uapi/linux/fuse.h`): a request is a `fuse_in_header`
//! and its body, an answer a `fuse_out_header` and its body, one per read and per write.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const OPEN: u32 = 14;
const INIT: u32 = 26;
const INTERRUPT: u32 = 36;
const BATCH_FORGET: u32 = 42;

const ROOT: u64 = 1;
const FILE: u64 = 2;
const IN_HEADER: usize = 40;

/// A mounted file system with one executable file whose opens stall.
pub struct StalledFile {
    dir: PathBuf,
    name: String,
    opens: Arc<AtomicUsize>,
    /// Written to stop the server, whose end of `/dev/fuse` then closes.
    stop: OwnedFd,
    server: Option<std::thread::JoinHandle<()>>,
}

impl StalledFile {
    /// Mounts it on `dir` (an empty directory), with the file `name` (mode 0755). Fails where
    /// FUSE cannot be mounted (not root, no `/dev/fuse`).
    #[allow(unsafe_code)]
    pub fn mount(dir: &Path, name: &str) -> io::Result<StalledFile> {
        use std::os::unix::ffi::OsStrExt;
        let device = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
        let device = OwnedFd::from(device);
        let options =
            format!("fd={},rootmode=40000,user_id=0,group_id=0,default_permissions,allow_other", device.as_raw_fd());
        let c =
            |bytes: &[u8]| std::ffi::CString::new(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e));
        let (source, target, kind, data) =
            (c(b"attune-stalled")?, c(dir.as_os_str().as_bytes())?, c(b"fuse")?, c(options.as_bytes())?);
        // SAFETY: mount(2) with NUL-terminated strings that live across the call.
        let mounted = unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                kind.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr() as *const libc::c_void,
            )
        };
        if mounted != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut ends = [0; 2];
        // SAFETY: pipe2 fills the local array with two new descriptors, owned once below.
        let (stop_read, stop) = unsafe {
            if libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                let error = io::Error::last_os_error();
                libc::umount2(target.as_ptr(), libc::MNT_DETACH);
                return Err(error);
            }
            (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1]))
        };
        let opens = Arc::new(AtomicUsize::new(0));
        let server = {
            let (name, opens) = (name.to_string(), opens.clone());
            std::thread::spawn(move || serve(device, stop_read, &name, &opens))
        };
        Ok(StalledFile { dir: dir.to_path_buf(), name: name.to_string(), opens, stop, server: Some(server) })
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// How many opens of the file have come (each waits, unanswered).
    pub fn opens(&self) -> usize {
        self.opens.load(Ordering::SeqCst)
    }
}

impl Drop for StalledFile {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: writes one byte from a static to the pipe this value owns.
        unsafe { libc::write(self.stop.as_raw_fd(), b"x".as_ptr() as *const libc::c_void, 1) };
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
        if let Ok(target) = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()) {
            // SAFETY: umount2(2) with a NUL-terminated path that lives across the call.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Answers requests until `stop` is readable; then closes the device, which aborts the
/// connection (what waits fails).
#[allow(unsafe_code)]
fn serve(device: OwnedFd, stop: OwnedFd, name: &str, opens: &AtomicUsize) {
    let mut buffer = vec![0u8; 1 << 18];
    loop {
        let mut fds = [
            libc::pollfd { fd: device.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: poll reads and writes the local array of two pollfds.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            continue;
        }
        if fds[1].revents != 0 || fds[0].revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            return;
        }
        // SAFETY: reads one request into the local buffer, of its length.
        let n = unsafe { libc::read(device.as_raw_fd(), buffer.as_mut_ptr() as *mut libc::c_void, buffer.len()) };
        if n < IN_HEADER as isize {
            if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENODEV) {
                return;
            }
            continue;
        }
        let request = &buffer[..n as usize];
        let u32_at = |at: usize| u32::from_le_bytes(request[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(request[at..at + 8].try_into().unwrap());
        let (opcode, unique, node) = (u32_at(4), u64_at(8), u64_at(16));
        let body = &request[IN_HEADER..];
        let answer: Option<Result<Vec<u8>, i32>> = match opcode {
            INIT => Some(Ok(init_out(u32::from_le_bytes(body[8..12].try_into().unwrap())))),
            GETATTR => Some(Ok(attr_out(node))),
            LOOKUP => {
                let asked = body.split(|b| *b == 0).next().unwrap_or_default();
                Some(if node == ROOT && asked == name.as_bytes() { Ok(entry_out(FILE)) } else { Err(libc::ENOENT) })
            }
            OPEN => {
                opens.fetch_add(1, Ordering::SeqCst);
                None
            }
            FORGET | BATCH_FORGET | INTERRUPT => None,
            _ => Some(Err(libc::ENOSYS)),
        };
        let Some(answer) = answer else { continue };
        let (error, body) = match answer {
            Ok(body) => (0, body),
            Err(errno) => (-errno, Vec::new()),
        };
        let mut out = Vec::with_capacity(16 + body.len());
        out.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
        out.extend_from_slice(&error.to_le_bytes());
        out.extend_from_slice(&unique.to_le_bytes());
        out.extend_from_slice(&body);
        // SAFETY: writes the local answer, of its length.
        unsafe { libc::write(device.as_raw_fd(), out.as_ptr() as *const libc::c_void, out.len()) };
    }
}

/// `fuse_init_out`: protocol 7.31, no optional feature.
fn init_out(max_readahead: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    for word in [7u32, 31, max_readahead, 0] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(&16u16.to_le_bytes()); // max_background
    out.extend_from_slice(&12u16.to_le_bytes()); // congestion_threshold
    out.extend_from_slice(&131072u32.to_le_bytes()); // max_write
    out.extend_from_slice(&1u32.to_le_bytes()); // time_gran
    out.extend_from_slice(&32u16.to_le_bytes()); // max_pages
    out.extend_from_slice(&0u16.to_le_bytes()); // map_alignment
    out.resize(64, 0);
    out
}

/// `fuse_attr` of the root directory or the file.
fn attr(node: u64) -> Vec<u8> {
    let (mode, size, nlink) =
        if node == ROOT { (libc::S_IFDIR | 0o755, 0u64, 2u32) } else { (libc::S_IFREG | 0o755, 4096, 1) };
    let mut out = Vec::with_capacity(88);
    for word in [node, size, size.div_ceil(512), 0, 0, 0] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    for word in [0u32, 0, 0, mode, nlink, 0, 0, 0, 4096, 0] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out
}

/// `fuse_attr_out` (valid for a second).
fn attr_out(node: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(104);
    out.extend_from_slice(&1u64.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&attr(node));
    out
}

/// `fuse_entry_out` (valid for a second).
fn entry_out(node: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    for word in [node, 0, 1, 1] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&attr(node));
    out
}
