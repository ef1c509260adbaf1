//! The messages between a worker and its long-lived supervisor (`supervise::server`), over a
//! `SOCK_SEQPACKET` socketpair: each message is one datagram (the kernel keeps the boundaries and
//! the order), and a spawn request carries the action's stdin, stdout and stderr as
//! `SCM_RIGHTS` descriptors.
//!
//! A message is `[kind: u8][run id: u64 LE][body]`. A spawn request larger than one datagram
//! (parameters in the environment can reach megabytes) is sent as `SPAWN_PART`s followed by one
//! `SPAWN` that carries the descriptors; the supervisor joins the parts of each run id, so
//! requests of several runs may interleave.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// Worker → supervisor: a part of a spawn request, more follow.
pub const SPAWN_PART: u8 = 1;
/// Worker → supervisor: the last part of a spawn request, with stdin, stdout and stderr.
pub const SPAWN: u8 = 2;
/// Worker → supervisor: send a signal to a run's process group (`[signal: i32]`).
pub const KILL: u8 = 3;
/// Worker → supervisor: the worker's lease on its runs now runs out at this deadline
/// (`[boot_clock_ns: u128]`, run id 0; docs/adr/0008): sent with each renewal, and to a new
/// supervisor first. A supervisor told so enforces it without the lease file.
pub const LEASE: u8 = 4;
/// Worker → supervisor: answer `PONG` with this id (no body): whether the supervisor's loop
/// goes on while a start is slow (an exec stuck on a stalled file system holds its starter alone).
pub const PING: u8 = 5;
/// Supervisor → worker: the run started (`[pid: i32]`, also its process group).
pub const STARTED: u8 = 10;
/// Supervisor → worker: the run could not start (`[errno: i32][message]`).
pub const NOT_STARTED: u8 = 11;
/// Supervisor → worker: the run's process ended and its group was killed (`[wait status: i32]`).
pub const EXITED: u8 = 12;
/// Supervisor → worker: the answer to a `PING` (its id).
pub const PONG: u8 = 13;

/// The largest datagram either side sends (a spawn request is cut into parts of this size).
pub const MAX_MESSAGE: usize = 32 * 1024;
const HEADER: usize = 9;
/// The body room of a spawn part.
pub const PART_BODY: usize = MAX_MESSAGE - HEADER;

/// What the supervisor starts for a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpawnRequest {
    pub program: OsString,
    pub args: Vec<OsString>,
    pub cwd: OsString,
    /// `NAME=value` entries, the whole environment of the action.
    pub env: Vec<OsString>,
    /// The worker's lease file (docs/adr/0008), if it has one.
    pub lease_file: Option<OsString>,
    pub memory_mb: Option<u64>,
    pub cpu_secs: Option<u64>,
    pub open_files: Option<u64>,
    /// The user (and group) id the action runs as.
    pub uid: Option<u32>,
    /// `RLIMIT_NPROC` (a run as a user of its own: `action_users`).
    pub processes: Option<u64>,
    /// `RLIMIT_FSIZE`, in bytes.
    pub file_size_bytes: Option<u64>,
}

impl SpawnRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.env.iter().map(|e| e.len() + 4).sum::<usize>());
        let bytes = |out: &mut Vec<u8>, b: &[u8]| {
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        };
        bytes(&mut out, self.program.as_bytes());
        bytes(&mut out, self.cwd.as_bytes());
        bytes(&mut out, self.lease_file.as_deref().map(OsStrExt::as_bytes).unwrap_or_default());
        for list in [&self.args, &self.env] {
            out.extend_from_slice(&(list.len() as u32).to_le_bytes());
            for item in list {
                bytes(&mut out, item.as_bytes());
            }
        }
        let uid = self.uid.map(u64::from);
        for number in [self.memory_mb, self.cpu_secs, self.open_files, uid, self.processes, self.file_size_bytes] {
            out.extend_from_slice(&number.unwrap_or(0).to_le_bytes());
        }
        out
    }

    pub fn decode(mut input: &[u8]) -> Option<SpawnRequest> {
        fn take<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            let (head, rest) = input.split_at_checked(n)?;
            *input = rest;
            Some(head)
        }
        fn u32_of(input: &mut &[u8]) -> Option<u32> {
            Some(u32::from_le_bytes(take(input, 4)?.try_into().ok()?))
        }
        fn bytes(input: &mut &[u8]) -> Option<OsString> {
            let n = u32_of(input)? as usize;
            Some(OsString::from_vec(take(input, n)?.to_vec()))
        }
        fn list(input: &mut &[u8]) -> Option<Vec<OsString>> {
            (0..u32_of(input)?).map(|_| bytes(input)).collect()
        }
        let program = bytes(&mut input)?;
        let cwd = bytes(&mut input)?;
        let lease_file = Some(bytes(&mut input)?).filter(|path| !path.is_empty());
        let args = list(&mut input)?;
        let env = list(&mut input)?;
        let mut number =
            || Some(u64::from_le_bytes(take(&mut input, 8)?.try_into().ok()?)).map(|n| (n > 0).then_some(n));
        let (memory_mb, cpu_secs, open_files, uid) = (number()?, number()?, number()?, number()?);
        let (processes, file_size_bytes) = (number()?, number()?);
        Some(SpawnRequest {
            program,
            args,
            cwd,
            env,
            lease_file,
            memory_mb,
            cpu_secs,
            open_files,
            uid: uid.map(u32::try_from).transpose().ok()?,
            processes,
            file_size_bytes,
        })
    }
}

/// A message's header and body.
pub fn message(kind: u8, run: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.push(kind);
    out.extend_from_slice(&run.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Splits a message into its kind, run id and body.
pub fn parse(message: &[u8]) -> Option<(u8, u64, &[u8])> {
    let (head, body) = message.split_at_checked(HEADER)?;
    Some((head[0], u64::from_le_bytes(head[1..].try_into().ok()?), body))
}

/// The `i32` at the start of a body.
pub fn int_of(body: &[u8]) -> Option<i32> {
    Some(i32::from_le_bytes(body.get(..4)?.try_into().ok()?))
}

/// The deadline a `LEASE` message carries.
pub fn deadline_of(body: &[u8]) -> Option<u128> {
    Some(u128::from_le_bytes(body.get(..16)?.try_into().ok()?))
}

/// A socketpair for a worker and its supervisor, both ends close-on-exec.
#[allow(unsafe_code)]
pub fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair writes two descriptors into a local array; each is owned once below.
    unsafe {
        if libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// A pipe, both ends close-on-exec: (read end, write end).
#[allow(unsafe_code)]
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into a local array; each is owned once below.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// Sends one datagram with `fds` attached, without waiting (`WouldBlock` when the socket's buffer
/// is full).
#[allow(unsafe_code)]
pub fn send(socket: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    let mut control = [0u64; 8]; // room for CMSG_SPACE of a few descriptors, aligned
    // SAFETY: msghdr and its control buffer are local; CMSG_* compute positions inside `control`,
    // which is large enough for up to 8 descriptors (checked); sendmsg only reads them.
    unsafe {
        let mut header: libc::msghdr = std::mem::zeroed();
        header.msg_iov = &mut iov;
        header.msg_iovlen = 1;
        if !fds.is_empty() {
            let size = std::mem::size_of_val(fds) as u32;
            assert!(fds.len() <= 8 && (libc::CMSG_SPACE(size) as usize) <= std::mem::size_of_val(&control));
            header.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            header.msg_controllen = libc::CMSG_SPACE(size) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&header);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg) as *mut RawFd, fds.len());
        }
        if libc::sendmsg(socket, &header, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives one datagram and the descriptors it carries, without waiting. `Ok(None)`: the other
/// end closed.
#[allow(unsafe_code)]
pub fn receive(socket: &impl AsRawFd, buffer: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut iov = libc::iovec { iov_base: buffer.as_mut_ptr() as *mut libc::c_void, iov_len: buffer.len() };
    let mut control = [0u64; 8];
    // SAFETY: msghdr, the buffer and the control buffer are live for the call; recvmsg writes at
    // most their lengths. Each descriptor received (close-on-exec by MSG_CMSG_CLOEXEC) is owned
    // once.
    unsafe {
        let mut header: libc::msghdr = std::mem::zeroed();
        header.msg_iov = &mut iov;
        header.msg_iovlen = 1;
        header.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        header.msg_controllen = std::mem::size_of_val(&control);
        let n = libc::recvmsg(socket.as_raw_fd(), &mut header, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&header);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&header, cmsg);
        }
        if n == 0 && fds.is_empty() {
            return Ok(None);
        }
        Ok(Some((n as usize, fds)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawn_request_round_trips() {
        let request = SpawnRequest {
            program: "/bin/sh".into(),
            args: vec!["run.sh".into(), "".into()],
            cwd: "/packs/core".into(),
            env: vec!["A=1".into(), OsString::from_vec(vec![b'B', b'=', 0xff])],
            lease_file: Some("/tmp/w.lease".into()),
            memory_mb: Some(128),
            cpu_secs: None,
            open_files: Some(16),
            uid: Some(1_900_000_001),
            processes: Some(256),
            file_size_bytes: Some(1 << 30),
        };
        assert_eq!(SpawnRequest::decode(&request.encode()), Some(request.clone()));
        let plain = SpawnRequest { program: "/bin/sh".into(), ..SpawnRequest::default() };
        assert_eq!(SpawnRequest::decode(&plain.encode()), Some(plain));
        let encoded = request.encode();
        assert_eq!(SpawnRequest::decode(&encoded[..encoded.len() - 1]), None, "cut short");
        assert_eq!(parse(&message(KILL, 7, &9i32.to_le_bytes())), Some((KILL, 7, &9i32.to_le_bytes()[..])));
        assert_eq!(parse(&[1, 2]), None);
    }

    #[test]
    fn descriptors_travel_with_their_message() {
        use std::io::{Read, Write};
        let (a, b) = socketpair().unwrap();
        let (read, write) = pipe().unwrap();
        send(a.as_raw_fd(), &message(SPAWN, 3, b"body"), &[write.as_raw_fd()]).unwrap();
        drop(write);
        let mut buffer = vec![0u8; MAX_MESSAGE];
        let (n, mut fds) = receive(&b, &mut buffer).unwrap().unwrap();
        assert_eq!(parse(&buffer[..n]), Some((SPAWN, 3, &b"body"[..])));
        assert_eq!(fds.len(), 1);
        std::fs::File::from(fds.remove(0)).write_all(b"through").unwrap();
        let mut text = String::new();
        std::fs::File::from(read).read_to_string(&mut text).unwrap();
        assert_eq!(text, "through");
        drop(a);
        assert!(receive(&b, &mut buffer).unwrap().is_none(), "the other end closed");
    }
}
