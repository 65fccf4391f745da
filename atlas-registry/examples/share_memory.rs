//! Two processes share device memory without a copy, as a prefill process hands its key-value
//! cache to a decode process: this process (the parent) starts itself again as a child, and the
//! two talk over a Unix socket pair.
//!
//! 1. The pool path: the parent makes an exportable memory pool, allocates a buffer from it and
//!    fills it with a pattern; it sends the child the pool's file descriptor (`SCM_RIGHTS`) and
//!    the buffer's export data (plain bytes); the child imports both, scales the buffer with a
//!    kernel and answers; the parent checks every element exactly.
//! 2. The legacy path: the same with a buffer of `DeviceBuffer::alloc` and its IPC handle (plain
//!    bytes alone).
//!
//! `cargo run -p atlas-registry --example share_memory`. Without a GPU or driver it prints one
//! line saying why and exits with status 1.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, ExitCode};

use atlas_registry::{
    AtlasRegistry, CudaStream, DeviceBuffer, DeviceUuid, FunctionCache, ImportedPool, IpcMemHandle,
    LaunchConfig, MemoryPool, PoolPointer, PoolProperties, SharedPool,
};

/// `x = x * factor`, over `n` floats.
static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");

/// What the child multiplies the shared memory by: every product of it with the pattern is exact.
const FACTOR: f32 = -2.5;
/// Floats shared each time (4 MiB).
const LEN: usize = 1 << 20;

/// A message from parent to child: what it is, the device's UUID, the export data, the length.
const MESSAGE: usize = 1 + 16 + PoolPointer::SIZE + 8;
const POOL: u8 = b'P';
const LEGACY: u8 = b'L';
const QUIT: u8 = b'Q';

fn parent() -> Result<(), String> {
    let host = atlas_registry::host(0).map_err(|e| e.to_string())?;
    let blobs = atlas_kernels::blobs_for_device("demo", host.compute_capability())
        .expect("the demo model is built in");
    let registry = AtlasRegistry::load(0, blobs).map_err(|e| e.to_string())?;
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).map_err(|e| e.to_string())?;
    let pattern: Vec<f32> = (0..LEN).map(|i| (i % 4096) as f32 - 2048.0).collect();
    let want: Vec<f32> = pattern.iter().map(|v| v * FACTOR).collect();
    let uuid = host.uuid().map_err(|e| e.to_string())?;
    println!("parent: device 0 is {} ({uuid})", host.name());

    let (socket, child_end) = UnixStream::pair().map_err(|e| e.to_string())?;
    inheritable(&child_end)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["--child", &child_end.as_raw_fd().to_string()])
        .spawn()
        .map_err(|e| format!("starting the child: {e}"))?;
    drop(child_end);
    let run = || -> Result<(), String> {
        // The pool path.
        let pool = MemoryPool::new(ctx, &PoolProperties::new().exportable(true))
            .map_err(|e| e.to_string())?;
        // SAFETY: `x` is used only on `stream`, which outlives it; no capture. The child has
        // released its import (it answered) before `x` is freed.
        let mut x = unsafe { pool.alloc_async::<f32>(&stream, LEN) }.map_err(|e| e.to_string())?;
        // Waits for the stream: the allocation exists before the child sees it.
        x.copy_from(&stream, &pattern).map_err(|e| e.to_string())?;
        let shared = pool.export().map_err(|e| e.to_string())?;
        let pointer = pool.export_pointer(&x).map_err(|e| e.to_string())?;
        send(
            &socket,
            &message(POOL, uuid, pointer.to_bytes()),
            Some(shared.fd()),
        )?;
        drop(shared); // the child has its own descriptor now
        answer(&socket)?;
        check(
            "pool",
            &x.to_vec(&stream).map_err(|e| e.to_string())?,
            &want,
        )?;
        x.free().map_err(|e| e.to_string())?;

        // The legacy path.
        let y = DeviceBuffer::from_slice(ctx, &stream, &pattern).map_err(|e| e.to_string())?;
        let handle = IpcMemHandle::export(&y).map_err(|e| e.to_string())?;
        send(&socket, &message(LEGACY, uuid, handle.to_bytes()), None)?;
        answer(&socket)?;
        check(
            "legacy IPC",
            &y.to_vec(&stream).map_err(|e| e.to_string())?,
            &want,
        )
    };
    let result = run();
    // The child leaves at the quit message, or when the socket closes.
    let _ = send(&socket, &message(QUIT, uuid, [0; PoolPointer::SIZE]), None);
    drop(socket);
    let status = child.wait().map_err(|e| e.to_string())?;
    result?;
    if !status.success() {
        return Err(format!("the child ended with {status}"));
    }
    Ok(())
}

/// The child: imports what the parent sends, scales it, answers; until the parent says quit.
fn child(fd: &str) -> Result<(), String> {
    let fd: i32 = fd
        .parse()
        .map_err(|_| format!("`{fd}` is not a descriptor"))?;
    // SAFETY: `fcntl(F_GETFD)` only asks whether the descriptor is open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(format!("descriptor {fd} was not inherited"));
    }
    // SAFETY: the socket the parent made this process inherit, for it alone (checked open above).
    let mut socket = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let host = atlas_registry::host(0).map_err(|e| e.to_string())?;
    let blobs = atlas_kernels::blobs_for_device("demo", host.compute_capability())
        .expect("the demo model is built in");
    let registry = AtlasRegistry::load(0, blobs).map_err(|e| e.to_string())?;
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).map_err(|e| e.to_string())?;
    let scale = SCALE.get(&registry).map_err(|e| e.to_string())?;
    loop {
        let (message, fd) = receive(&socket)?;
        let device = DeviceUuid::from_bytes(message[1..17].try_into().expect("16 bytes"));
        let data: [u8; PoolPointer::SIZE] = message[17..17 + PoolPointer::SIZE]
            .try_into()
            .expect("the export data");
        let len = u64::from_le_bytes(message[MESSAGE - 8..].try_into().expect("8 bytes")) as usize;
        let mut x = match message[0] {
            QUIT => return Ok(()),
            POOL => {
                let fd = fd.ok_or("the pool's descriptor did not come")?;
                let pool = ImportedPool::import(ctx, &SharedPool::from_parts(fd, device))
                    .map_err(|e| e.to_string())?;
                // SAFETY: the parent made `data` with `export_pointer` after synchronizing the
                // allocating stream, and keeps the buffer (and lives) until this answers.
                unsafe { pool.import_pointer::<f32>(&PoolPointer::from_bytes(data), len) }
                    .map_err(|e| e.to_string())?
            }
            LEGACY => {
                let handle = IpcMemHandle::from_bytes(data);
                // SAFETY: the parent made `handle` with `export`, and keeps the buffer (and
                // lives) until this answers.
                unsafe { handle.open::<f32>(ctx, len) }.map_err(|e| e.to_string())?
            }
            other => return Err(format!("unknown message {other}")),
        };
        let n = x.len() as u32;
        // SAFETY: `scale` touches the `n` floats of `x`, which lives until the synchronize below.
        unsafe {
            scale.launch(
                &stream,
                &LaunchConfig::for_elements(n, 256),
                (&mut x, FACTOR, n),
            )
        }
        .map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())?;
        // Released (after the device's work) before the parent hears back.
        drop(x);
        println!("child: scaled {n} shared floats by {FACTOR}");
        socket.write_all(&[0]).map_err(|e| e.to_string())?;
    }
}

fn message(kind: u8, device: DeviceUuid, data: [u8; PoolPointer::SIZE]) -> [u8; MESSAGE] {
    let mut out = [0; MESSAGE];
    out[0] = kind;
    out[1..17].copy_from_slice(&device.bytes());
    out[17..17 + PoolPointer::SIZE].copy_from_slice(&data);
    out[MESSAGE - 8..].copy_from_slice(&(LEN as u64).to_le_bytes());
    out
}

/// Waits for the child's answer.
fn answer(mut socket: &UnixStream) -> Result<(), String> {
    let mut byte = [1];
    socket
        .read_exact(&mut byte)
        .map_err(|e| format!("the child did not answer: {e}"))?;
    Ok(())
}

fn check(path: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    let wrong = got.iter().zip(want).filter(|(g, w)| g != w).count();
    println!(
        "parent: {path}: the child scaled {} floats; {wrong} differ",
        got.len()
    );
    if wrong == 0 {
        Ok(())
    } else {
        Err(format!("{wrong} floats differ after the {path} path"))
    }
}

/// Lets the child inherit `socket` (clears its close-on-exec flag).
fn inheritable(socket: &UnixStream) -> Result<(), String> {
    // SAFETY: the socket is open (borrowed); F_SETFD only changes its close-on-exec flag.
    if unsafe { libc::fcntl(socket.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
        return Err(format!(
            "fcntl(F_SETFD): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Room for the control message of one descriptor, aligned as `cmsghdr` needs.
#[repr(C, align(8))]
struct Control([u8; 64]);

/// Sends `bytes`, with `fd` attached (`SCM_RIGHTS`) when given.
fn send(socket: &UnixStream, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> Result<(), String> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    let mut control = Control([0; 64]);
    // SAFETY: an all-zero `msghdr` is a valid empty message (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let raw: libc::c_int = fd.as_raw_fd();
        // SAFETY: CMSG_SPACE and CMSG_LEN compute sizes only.
        let (space, len) = unsafe {
            (
                libc::CMSG_SPACE(size_of::<libc::c_int>() as u32),
                libc::CMSG_LEN(size_of::<libc::c_int>() as u32),
            )
        };
        assert!(space as usize <= control.0.len());
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg` points to `control`, aligned and large enough for one control message
        // of one descriptor (asserted above), so the first header is in it; the descriptor is
        // written unaligned into its data.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = len as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), raw);
        }
    }
    // SAFETY: `msg` names `iov` (over `bytes`) and `control`, all alive through the call; the
    // descriptor is open (borrowed).
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, 0) };
    if sent < 0 {
        return Err(format!("sendmsg: {}", std::io::Error::last_os_error()));
    }
    // A stream socket may take part of the bytes; the descriptor went with the first.
    let mut writer = socket;
    writer
        .write_all(&bytes[sent as usize..])
        .map_err(|e| e.to_string())
}

/// Receives one message, and the descriptor sent with it if any (close-on-exec).
fn receive(socket: &UnixStream) -> Result<([u8; MESSAGE], Option<OwnedFd>), String> {
    let mut bytes = [0u8; MESSAGE];
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    let mut control = Control([0; 64]);
    // SAFETY: as in `send`.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len() as _;
    // SAFETY: `msg` names `iov` (over `bytes`) and `control`, writable and alive through the call.
    let got = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got < 0 {
        return Err(format!("recvmsg: {}", std::io::Error::last_os_error()));
    }
    if got == 0 {
        return Err("the parent closed the socket".into());
    }
    let mut fd = None;
    // SAFETY: the kernel filled `control` and set `msg_controllen`; CMSG_FIRSTHDR stays inside
    // it (or is null), and an SCM_RIGHTS message of the length of one descriptor holds an open
    // descriptor that is now this process's alone.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        if !header.is_null()
            && (*header).cmsg_level == libc::SOL_SOCKET
            && (*header).cmsg_type == libc::SCM_RIGHTS
            && (*header).cmsg_len as usize
                == libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize
        {
            let raw = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>());
            fd = Some(OwnedFd::from_raw_fd(raw));
        }
    }
    let mut reader = socket;
    reader
        .read_exact(&mut bytes[got as usize..])
        .map_err(|e| e.to_string())?;
    Ok((bytes, fd))
}

/// What `--help` and `-h` print.
const USAGE: &str = "\
usage: share_memory

Shares device memory of GPU 0 with a child process (itself, started again with `--child FD`):
first an allocation of an exportable memory pool (the pool's file descriptor sent over a Unix
socket with SCM_RIGHTS, the allocation's export data as plain bytes), then a `DeviceBuffer::alloc`
buffer through its legacy IPC handle. The child scales each with a kernel; the parent checks
every element exactly. Without a GPU or driver it prints one line saying why and exits with
status 1; ATLAS_LIBCUDA_PATH chooses the driver library.

cargo run -p atlas-registry --example share_memory";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = match args.as_slice() {
        [flag, fd] if flag == "--child" => child(fd),
        [] => parent(),
        _ => Err(format!("unexpected arguments {args:?}; see --help")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
