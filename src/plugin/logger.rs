//! The logger handed to a plugin's `init` (`ncclDebugLogger_t`, for net and tuner plugins alike): a C variadic function that
//! formats with the C library's `vsnprintf` and forwards the line to oxccl's log
//! (`crate::debug`) at the plugin's level and subsystem flags.
//!
//! Stable Rust cannot define a C variadic function, so the entry is a few instructions of
//! assembly per architecture: it spills the argument registers into a register save area,
//! builds the platform's `va_list` over it (System V x86-64 or AAPCS64) and calls
//! [`forward`] with the five named arguments and that `va_list`. On any other architecture
//! the logger prints the plugin's format string without its arguments.

use crate::debug::{self, Level};
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_ulong, c_void};

/// `ncclDebugLogLevel` values.
pub const NCCL_LOG_NONE: c_int = 0;
pub const NCCL_LOG_VERSION: c_int = 1;
pub const NCCL_LOG_WARN: c_int = 2;
pub const NCCL_LOG_INFO: c_int = 3;
pub const NCCL_LOG_ABORT: c_int = 4;
pub const NCCL_LOG_TRACE: c_int = 5;

/// `ncclDebugLogger_t`: `void (*)(ncclDebugLogLevel, unsigned long flags, const char* file,
/// int line, const char* fmt, ...)`.
#[allow(non_camel_case_types)]
pub type ncclDebugLogger_t =
    unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);

/// Bytes of one formatted line, as NVIDIA's own logger (longer lines are cut).
const LINE_BYTES: usize = 1024;

extern "C" {
    /// C's `vsnprintf`; `ap` is a `va_list`, which both supported ABIs pass as a pointer
    /// (an array that decays on x86-64, a 32-byte struct passed by reference on AArch64).
    fn vsnprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ap: *mut c_void) -> c_int;
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
extern "C" {
    /// The assembly entry below.
    fn oxccl_net_plugin_logger(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
}

/// The function to give a plugin's `init`.
pub fn logger() -> ncclDebugLogger_t {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        oxccl_net_plugin_logger
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        fallback::logger()
    }
}

// System V x86-64: on entry rdi..r8 hold the named arguments, r9 the first variadic integer,
// xmm0..xmm7 the variadic doubles, the rest is on the stack above the return address. The
// frame below rbp: [rsp, rsp+48) the six integer registers, [rsp+48, rsp+176) the eight
// vector registers (16-byte aligned), [rsp+176, rsp+200) the va_list: gp_offset 40 (five
// integer registers named), fp_offset 48 (none named), overflow_arg_area rbp+16,
// reg_save_area rsp. rdi..r8 are untouched, so forward gets them as they came and r9 = &ap.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.oxccl_net_plugin_logger,\"ax\",@progbits",
    ".p2align 4",
    ".globl oxccl_net_plugin_logger",
    ".hidden oxccl_net_plugin_logger",
    ".type oxccl_net_plugin_logger,@function",
    "oxccl_net_plugin_logger:",
    "push rbp",
    "mov rbp, rsp",
    "sub rsp, 208",
    "mov [rsp], rdi",
    "mov [rsp + 8], rsi",
    "mov [rsp + 16], rdx",
    "mov [rsp + 24], rcx",
    "mov [rsp + 32], r8",
    "mov [rsp + 40], r9",
    "movaps [rsp + 48], xmm0",
    "movaps [rsp + 64], xmm1",
    "movaps [rsp + 80], xmm2",
    "movaps [rsp + 96], xmm3",
    "movaps [rsp + 112], xmm4",
    "movaps [rsp + 128], xmm5",
    "movaps [rsp + 144], xmm6",
    "movaps [rsp + 160], xmm7",
    "mov dword ptr [rsp + 176], 40",
    "mov dword ptr [rsp + 180], 48",
    "lea rax, [rbp + 16]",
    "mov [rsp + 184], rax",
    "mov [rsp + 192], rsp",
    "lea r9, [rsp + 176]",
    "call {forward}",
    "leave",
    "ret",
    ".size oxccl_net_plugin_logger, . - oxccl_net_plugin_logger",
    ".popsection",
    forward = sym forward,
);

// AAPCS64: x0..x4 hold the named arguments, x5..x7 the first variadic integers, q0..q7 the
// variadic floating-point values, the rest is on the stack at the caller's sp. The frame
// below x29: [sp, sp+32) the va_list { __stack = x29+16, __gr_top = sp+224, __vr_top =
// sp+160, __gr_offs = -24 (three integer registers left), __vr_offs = -128 (eight left) },
// [sp+32, sp+160) q0..q7, [sp+160, sp+224) x0..x7. x0..x4 are untouched; x5 = &ap.
#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    ".pushsection .text.oxccl_net_plugin_logger,\"ax\",%progbits",
    ".p2align 4",
    ".globl oxccl_net_plugin_logger",
    ".hidden oxccl_net_plugin_logger",
    ".type oxccl_net_plugin_logger,%function",
    "oxccl_net_plugin_logger:",
    "stp x29, x30, [sp, #-16]!",
    "mov x29, sp",
    "sub sp, sp, #224",
    "stp x0, x1, [sp, #160]",
    "stp x2, x3, [sp, #176]",
    "stp x4, x5, [sp, #192]",
    "stp x6, x7, [sp, #208]",
    "stp q0, q1, [sp, #32]",
    "stp q2, q3, [sp, #64]",
    "stp q4, q5, [sp, #96]",
    "stp q6, q7, [sp, #128]",
    "add x9, x29, #16",
    "str x9, [sp]",
    "add x9, sp, #224",
    "str x9, [sp, #8]",
    "add x9, sp, #160",
    "str x9, [sp, #16]",
    "mov w9, #-24",
    "str w9, [sp, #24]",
    "mov w9, #-128",
    "str w9, [sp, #28]",
    "mov x5, sp",
    "bl {forward}",
    "mov sp, x29",
    "ldp x29, x30, [sp], #16",
    "ret",
    ".size oxccl_net_plugin_logger, . - oxccl_net_plugin_logger",
    ".popsection",
    forward = sym forward,
);

/// Format one plugin line and log it. Called by the assembly entry with the plugin's named
/// arguments and a `va_list` over its variadic ones.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
unsafe extern "C" fn forward(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    ap: *mut c_void,
) {
    let Some(lvl) = level_of(level) else { return };
    // (Tests look at every line, printed or not.)
    if fmt.is_null() || !(debug::enabled(lvl, flags as u32) || cfg!(test)) {
        return;
    }
    let mut buf = [0 as c_char; LINE_BYTES];
    // SAFETY: buf is writable for LINE_BYTES bytes and vsnprintf NUL-terminates within them;
    // fmt and ap are what the plugin passed to its logger, as printf's contract requires.
    unsafe { vsnprintf(buf.as_mut_ptr(), LINE_BYTES, fmt, ap) };
    // SAFETY: vsnprintf wrote a NUL-terminated string into buf.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
    // SAFETY: a non-null file is the plugin's NUL-terminated string (its __FILE__ or
    // __func__), valid for the call.
    let place = (!file.is_null()).then(|| unsafe { CStr::from_ptr(file) }.to_string_lossy());
    emit(lvl, flags, place.as_deref().unwrap_or(""), line, &text);
}

/// oxccl's level for a plugin's `ncclDebugLogLevel` (None: not a line to print).
fn level_of(level: c_int) -> Option<Level> {
    match level {
        NCCL_LOG_VERSION => Some(Level::Version),
        NCCL_LOG_WARN | NCCL_LOG_ABORT => Some(Level::Warn),
        NCCL_LOG_INFO => Some(Level::Info),
        NCCL_LOG_TRACE => Some(Level::Trace),
        _ => None,
    }
}

/// Log a formatted plugin line (its own text ends in a newline more often than not). `place`
/// is what the plugin passed as `filefunc`: as NVIDIA's logger takes it, a WARN's file and a
/// TRACE's function.
fn emit(lvl: Level, flags: c_ulong, place: &str, line: c_int, text: &str) {
    let text = text.trim_end_matches('\n');
    #[cfg(test)]
    tests::capture(text);
    let line = u32::try_from(line).unwrap_or(0);
    let site = match lvl {
        Level::Trace => debug::Site {
            file: "",
            line,
            func: place,
        },
        _ => debug::Site {
            file: place,
            line,
            func: "",
        },
    };
    // The macros take a subsystem name; a plugin's flags are a run-time mask.
    debug::log(lvl, flags as u32, site, format_args!("{text}"));
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod fallback {
    use super::*;

    /// Takes the named arguments only (where the platform passes them as a non-variadic
    /// call would) and logs the format string as it is.
    unsafe extern "C" fn unformatted(
        level: c_int,
        flags: c_ulong,
        _file: *const c_char,
        line: c_int,
        fmt: *const c_char,
    ) {
        let Some(lvl) = level_of(level) else { return };
        if fmt.is_null() || !debug::enabled(lvl, flags as u32) {
            return;
        }
        // SAFETY: fmt is the plugin's NUL-terminated format string.
        emit(
            lvl,
            flags,
            "",
            line,
            &unsafe { CStr::from_ptr(fmt) }.to_string_lossy(),
        );
    }

    pub fn logger() -> ncclDebugLogger_t {
        // SAFETY: the named arguments are passed as in a non-variadic call on the platforms
        // oxccl builds for; the variadic ones are never read.
        unsafe { std::mem::transmute(unformatted as unsafe extern "C" fn(_, _, _, _, _)) }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use parking_lot::Mutex;

    static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

    pub(super) fn capture(text: &str) {
        LINES.lock().push(text.to_string());
    }

    /// Whether some forwarded line equals `text`.
    pub(crate) fn logged(text: &str) -> bool {
        LINES.lock().iter().any(|l| l == text)
    }

    #[test]
    fn levels_map_to_oxccl_levels() {
        assert_eq!(level_of(NCCL_LOG_WARN), Some(Level::Warn));
        assert_eq!(level_of(NCCL_LOG_INFO), Some(Level::Info));
        assert_eq!(level_of(NCCL_LOG_TRACE), Some(Level::Trace));
        assert_eq!(level_of(NCCL_LOG_NONE), None);
        assert_eq!(level_of(99), None);
    }

    #[test]
    fn the_variadic_entry_formats_every_kind_of_argument() {
        let log = logger();
        // More integers than fit in registers, more doubles than one, a string on the stack.
        // SAFETY: the format matches the arguments, as printf requires.
        unsafe {
            log(
                NCCL_LOG_WARN,
                !0,
                c"test.c".as_ptr(),
                7,
                c"oxtest %s %d %ld %.2f %u %c %zu %.1f %s %d %x".as_ptr(),
                c"one".as_ptr(),
                -2 as c_int,
                3_000_000_000_i64,
                4.25_f64,
                5 as std::os::raw::c_uint,
                b'6' as c_int,
                7_usize,
                8.5_f64,
                c"nine".as_ptr(),
                10 as c_int,
                0xb_u32,
            )
        };
        assert!(
            logged("oxtest one -2 3000000000 4.25 5 6 7 8.5 nine 10 b"),
            "{:?}",
            LINES.lock()
        );
    }

    #[test]
    fn doubles_and_integers_past_the_registers_keep_their_order() {
        let log = logger();
        // SAFETY: the format matches the arguments.
        unsafe {
            log(
                NCCL_LOG_INFO,
                !0,
                c"test.c".as_ptr(),
                8,
                c"oxtest2 %g %g %g %g %g %g %g %g %g %g %d %d %d %d".as_ptr(),
                1.0_f64,
                2.0_f64,
                3.0_f64,
                4.0_f64,
                5.0_f64,
                6.0_f64,
                7.0_f64,
                8.0_f64,
                9.0_f64,
                10.5_f64,
                11 as c_int,
                12 as c_int,
                13 as c_int,
                14 as c_int,
            )
        };
        assert!(
            logged("oxtest2 1 2 3 4 5 6 7 8 9 10.5 11 12 13 14"),
            "{:?}",
            LINES.lock()
        );
    }
}
