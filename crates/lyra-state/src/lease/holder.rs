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
            start: start_time(&std::fs::read_to_string("/proc/self/stat").ok()?)?.1,
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

/// From a `/proc/<pid>/stat` line: the process's state letter and its start time (clock ticks
/// after boot). The command name, in parentheses, may hold spaces and parentheses itself:
/// the fields are counted from the last `)`.
fn start_time(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // `state` is field 3; `starttime` is field 22.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// A new token's suffix naming this process (empty where it cannot be named).
pub(super) fn token_suffix() -> String {
    this().map(Process::token_suffix).unwrap_or_default()
}

/// Whether the holder named in `token` is a process this one can see that has ended: gone, a
/// zombie, or its PID now another process's. `false` whenever that cannot be told.
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
        Ok(stat) => match start_time(&stat) {
            // A zombie has ended; only its parent has not looked yet.
            Some((state, start)) => start != holder.start || matches!(state, 'Z' | 'X'),
            None => false,
        },
        // `/proc` mounted with `hidepid` hides other users' processes: only the kernel can
        // say that there is none of that PID.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => no_such_process(holder.pid),
        Err(_) => false,
    }
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
    let (_, start) = start_time(&stat).expect("its start time");
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
        let tail = "S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        assert_eq!(start_time(&format!("12 (lyra) {tail}")), Some(('S', 987654)));
        assert_eq!(start_time(&format!("12 (a) b) (c) {tail}")), Some(('S', 987654)));
        assert_eq!(start_time("12 (lyra) S 1 2"), None);
        assert_eq!(start_time("no parenthesis"), None);
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
