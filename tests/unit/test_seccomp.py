from ringfence.policy.seccomp import DENIED_SYSCALLS, compile_filter


def test_the_deny_list_covers_the_threat_model() -> None:
    for name in (
        "ptrace",
        "mount",
        "unshare",
        "setns",
        "init_module",
        "finit_module",
        "kexec_load",
        "bpf",
        "keyctl",
        "add_key",
        "perf_event_open",
        "userfaultfd",
        "open_by_handle_at",
        "io_uring_setup",
        "pivot_root",
        "chroot",
    ):
        assert name in DENIED_SYSCALLS


def test_the_filter_compiles_to_a_bpf_program_once() -> None:
    program = compile_filter()
    assert len(program) % 8 == 0 and len(program) > 8 * len(DENIED_SYSCALLS)
    assert compile_filter() is program
