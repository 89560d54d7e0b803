//! Which process holds a lease, so that a process on the same machine can tell that the holder
//! has ended (killed, crashed) and take its lease over at once rather than after its time to
//! live.
//!
//! The holder's identity travels in the lease's token, after its random part: the stores
//! only ever compare tokens, so no column is needed, and leases taken by older versions
//! (a bare random token) are simply never taken over. The identity is the boot, the PID
//! namespace, the PID and the process's start time. A process is only judged by one that sees
//! it: the same boot and the same PID namespace; any other (another machine, another
//! container, a reboot since) cannot tell, and waits for the time to live as before. The start
//! time tells a reused PID from the holder. A holder is never judged ended on what cannot be
//! read: a process hidden from this user (`/proc` mounted with `hidepid`) still answers a
//! signal 0.

use std::sync::OnceLock;

/// What separates the random part of a token from the holder's identity.
const MARK: &str = "~";

/// A process's identity, as written in tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Process {
    boot: String,
    pid_ns: u64,
    pid: u32,
    start: u64,
}

impl Process {
    fn token_suffix(&self) -> String {
        format!("{MARK}{}.{}.{}.{}", self.boot, self.pid_ns, self.pid, self.start)
    }

    fn parse(token: &str) -> Option<Process> {
        let (_, identity) = token.split_once(MARK)?;
        let mut parts = identity.split('.');
        let boot = parts.next()?.to_owned();
        let pid_ns = parts.next()?.parse().ok()?;
        let pid = parts.next()?.parse().ok()?;
        let start = parts.next()?.parse().ok()?;
        if parts.next().is_some() || boot.is_empty() || !boot.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(Process {
            boot,
            pid_ns,
            pid,
            start,
        })
    }
}

/// This process, where the system says (Linux); `None` elsewhere.
fn this() -> Option<&'static Process> {
    static THIS: OnceLock<Option<Process>> = OnceLock::new();
    THIS.get_or_init(|| {
        let pid = std::process::id();
        Some(Process {
            boot: boot_id()?,
            pid_ns: pid_namespace()?,
            pid,
            start: Stat::parse(&std::fs::read_to_string("/proc/self/stat").ok()?)?.start,
        })
    })
    .as_ref()
}

/// The kernel's id of this boot, its dashes left out.
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id: String = id.trim().chars().filter(|c| *c != '-').collect();
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// The inode of this process's PID namespace (`pid:[4026531836]`).
fn pid_namespace() -> Option<u64> {
    let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let link = link.to_str()?;
    link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// `R`, `S`, `D`, `Z`...
    state: char,
    /// The kernel's flags of its task (`PF_*`).
    flags: u64,
    /// Clock ticks after boot.
    start: u64,
}

/// `PF_EXITING`: the task is in the kernel's exit path, which no process leaves alive. A
/// killed process spends a while there before it is a zombie (releasing its memory, closing
/// its files), the longer the more memory it had.
const EXITING: u64 = 0x4;

impl Stat {
    /// From a `/proc/<pid>/stat` line. The command name, in parentheses, may hold spaces and
    /// parentheses itself: the fields are counted from the last `)`.
    fn parse(stat: &str) -> Option<Stat> {
        let rest = &stat[stat.rfind(')')? + 1..];
        let mut fields = rest.split_ascii_whitespace();
        // `state` is field 3, `flags` field 9 and `starttime` field 22.
        let state = fields.next()?.chars().next()?;
        let flags = fields.nth(5)?.parse().ok()?;
        let start = fields.nth(12)?.parse().ok()?;
        Some(Stat { state, flags, start })
    }

    /// Whether the process has ended or is ending: a zombie, or in its exit.
    fn ending(&self) -> bool {
        matches!(self.state, 'Z' | 'X') || self.flags & EXITING != 0
    }
}

/// A new token's suffix naming this process (empty where it cannot be named).
pub(super) fn token_suffix() -> String {
    this().map(Process::token_suffix).unwrap_or_default()
}

/// Whether the holder named in `token` is a process this one can see that has ended: gone, a
/// zombie, in its exit or killed, or its PID now another process's. `false` whenever that
/// cannot be told.
pub(super) fn has_ended(token: &str) -> bool {
    let Some(holder) = Process::parse(token) else {
        return false;
    };
    let Some(me) = this() else { return false };
    if holder.boot != me.boot || holder.pid_ns != me.pid_ns {
        return false;
    }
    if holder.pid == me.pid {
        return holder.start != me.start;
    }
    match std::fs::read_to_string(format!("/proc/{}/stat", holder.pid)) {
        // A zombie has ended, and only its parent has not looked yet. A process in its exit,
        // or with a SIGKILL waiting, never runs its own code again (a write it had under way
        // is fenced off all the same).
        Ok(stat) => Stat::parse(&stat).is_some_and(|s| s.start != holder.start || s.ending() || killed(holder.pid)),
        // `/proc` mounted with `hidepid` hides other users' processes: only the kernel can
        // say that there is none of that PID.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => no_such_process(holder.pid),
        Err(_) => false,
    }
}

/// Whether a `SIGKILL` waits for the process (`/proc/<pid>/status`, pending for one of its
/// threads or for all): sent, it cannot be blocked or caught, and the process runs none of
/// its own code again. Between `kill -9` and its exit a process may wait a few milliseconds
/// for a CPU.
fn killed(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| sigkill_pending(&status))
}

/// Whether a `/proc/<pid>/status` text has `SIGKILL` (signal 9: bit 8 of the hexadecimal
/// masks) pending for a thread (`SigPnd`) or the process (`ShdPnd`).
fn sigkill_pending(status: &str) -> bool {
    const SIGKILL: u64 = 1 << 8;
    status.lines().any(|line| {
        let mask = line.strip_prefix("SigPnd:").or_else(|| line.strip_prefix("ShdPnd:"));
        mask.and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & SIGKILL != 0)
    })
}

/// Whether no process has this PID (a signal 0 to it finds none; one that may not be
/// signalled exists).
fn no_such_process(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else {
        return false;
    };
    rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH)
}

/// The end of `token` that names its process, from the mark on (empty if none): what others
/// may see of a token.
pub(crate) fn public_part(token: &str) -> &str {
    token.find(MARK).map_or("", |at| &token[at..])
}

/// Whether `part` is a whole [`public_part`] naming a process: the stores break a lease by
/// the end of its token only when that end is one.
pub(crate) fn is_public_part(part: &str) -> bool {
    part.starts_with(MARK) && Process::parse(part).is_some()
}

/// The holder's PID, when its token names one: for messages.
pub(super) fn pid(token: &str) -> Option<u32> {
    Process::parse(token).map(|p| p.pid)
}

/// A token as process `pid` (of this machine and namespace) would have made it.
#[cfg(test)]
pub(super) fn token_naming(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process's stat");
    let start = Stat::parse(&stat).expect("its start time").start;
    let holder = Process {
        pid,
        start,
        ..this().expect("Linux names its processes").clone()
    };
    format!("{:032x}{}", 1u128, holder.token_suffix())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_read_back_from_tokens() {
        let p = Process {
            boot: "0a1b".into(),
            pid_ns: 4026531836,
            pid: 42,
            start: 123456,
        };
        let token = format!("{:032x}{}", 7u128, p.token_suffix());
        assert_eq!(Process::parse(&token), Some(p));
        assert_eq!(pid(&token), Some(42));
        for bad in [
            "00000000000000000000000000000007",
            "x~",
            "x~0a1b.1.2",
            "x~0a1b.1.2.3.4",
            "x~zz.1.2.3",
            "x~.1.2.3",
            "x~0a1b.-1.2.3",
        ] {
            assert_eq!(Process::parse(bad), None, "{bad}");
            assert!(!has_ended(bad), "{bad}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn only_the_kernel_says_that_no_process_has_a_pid() {
        assert!(!no_such_process(std::process::id()));
        // PID 1 exists in every namespace, whoever may signal it.
        assert!(!no_such_process(1));
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait");
        assert!(no_such_process(pid) || std::fs::metadata(format!("/proc/{pid}")).is_ok());
        assert!(!no_such_process(0) && !no_such_process(u32::MAX));
    }

    #[test]
    fn only_a_whole_process_part_is_one() {
        let token = "0123~b00.1.42.7";
        assert_eq!(public_part(token), "~b00.1.42.7");
        assert!(is_public_part(public_part(token)));
        assert_eq!(public_part("0123"), "");
        for not in ["", "~", "b00.1.42.7", "x~b00.1.42.7", "~b00~1.42.7"] {
            assert!(!is_public_part(not), "{not:?}");
        }
    }

    #[test]
    fn stat_lines_are_read_past_odd_command_names() {
        // Fields 3 (state) to 22 (starttime), flags (9) among them.
        let tail = "S 1 2 3 4 5 4194560 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        let sleeping = Stat {
            state: 'S',
            flags: 4194560,
            start: 987654,
        };
        assert_eq!(Stat::parse(&format!("12 (lyra) {tail}")), Some(sleeping));
        assert_eq!(Stat::parse(&format!("12 (a) b) (c) {tail}")), Some(sleeping));
        assert!(!sleeping.ending());
        // A killed process in its exit (PF_EXITING with the flags a worker has), and zombies.
        let exiting = Stat::parse(&format!("12 (lyra) {}", tail.replace("4194560", "4194564"))).expect("a stat line");
        assert!(exiting.ending());
        assert!(Stat { state: 'Z', ..sleeping }.ending());
        assert!(Stat { state: 'X', ..sleeping }.ending());
        assert_eq!(Stat::parse("12 (lyra) S 1 2"), None);
        assert_eq!(Stat::parse("12 (lyra) S 1 2 3 4 5 flags 7"), None);
        assert_eq!(Stat::parse("no parenthesis"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_alive_and_a_changed_start_is_not_it() {
        let me = this().expect("Linux names its processes");
        let token = format!("r{}", me.token_suffix());
        assert!(!has_ended(&token));
        let reused = Process {
            start: me.start + 1,
            ..me.clone()
        };
        assert!(has_ended(&format!("r{}", reused.token_suffix())));
        // Another boot or namespace cannot be judged.
        let elsewhere = Process {
            boot: "ff".into(),
            pid: u32::MAX,
            ..me.clone()
        };
        assert!(!has_ended(&format!("r{}", elsewhere.token_suffix())));
    }

    #[test]
    fn a_pending_sigkill_is_read_from_either_mask() {
        let status = |sig: &str, shd: &str| {
            format!("Name:\tlyra\nState:\tR (running)\nSigPnd:\t{sig}\nShdPnd:\t{shd}\nSigBlk:\t0000000000000100\n")
        };
        assert!(!sigkill_pending(&status("0000000000000000", "0000000000000000")));
        // SIGTERM (bit 14) and SIGSTOP (bit 18) are not it; a blocked mask does not count.
        assert!(!sigkill_pending(&status("0000000000004000", "0000000000020000")));
        assert!(sigkill_pending(&status("0000000000000100", "0000000000000000")));
        assert!(sigkill_pending(&status("0000000000000000", "0000000000004100")));
        assert!(!sigkill_pending("Name:\tlyra\nSigPnd:\tnot hex\n"));
        assert!(!sigkill_pending(""));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_running_child_has_not_ended_until_it_is_killed() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("spawn sleep");
        let token = token_naming(child.id());
        assert!(!has_ended(&token), "sleeping, not exiting");
        assert!(!killed(child.id()));
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert!(has_ended(&token));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_ended_child_is_seen_to_have_ended_even_before_it_is_reaped() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let token = token_naming(child.id());
        // Not reaped yet: a zombie once it exits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !has_ended(&token) {
            assert!(std::time::Instant::now() < deadline, "the child never ended");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait().expect("wait");
        assert!(has_ended(&token), "reaped: gone");
    }
}
