"""The shell entrypoint of an attempt's main container (POSIX ``sh``: it runs in the user's image).

Shipped in the attempt's ConfigMap as ``/etc/kiln/entrypoint.sh`` and run as
``/bin/sh /etc/kiln/entrypoint.sh COMMAND [ARG...]``. It

1. sources ``gang.env`` (what every process of the attempt shares) and, for this member, the env file
   ``ROLE-INDEX-LOCAL.env`` (what differs per process), ``INDEX`` being ``$JOB_COMPLETION_INDEX`` (set by the
   Indexed Job; 0 for a plain Job) and ``LOCAL`` the process's local rank;
2. runs ``prepare_command``, then the command (once, or ``$KILN_PROCS`` times for a PyTorch worker with
   ``procs_per_worker > 1``, each with its own env file; the first failure stops the others), then
   ``finish_command`` with ``$KILN_EXIT_CODE`` — as the local executor's shim does: a failed prepare skips the
   command, finish runs whatever the outcome unless the pod is being stopped, and a failing finish fails an
   otherwise successful attempt;
3. passes SIGTERM (pod deletion, ``activeDeadlineSeconds``) on to the job's whole process tree (``kill 0``:
   the shell is PID 1, so its process group is the container's);
4. for an MPI gang, members other than 0 run ``$KILN_MPI_DAEMON`` (e.g. sshd) instead of the command: the
   launcher's ``mpirun`` starts the ranks on them;
5. with ``$KILN_SYNC_TIMEOUT`` > 0 (a sync sidecar runs beside it: ``podsync.py``), writes
   ``$KILN_RUN_DIR/ended-MEMBER`` once everything has run (or was stopped) and waits, at most that many seconds,
   for the sidecar's ``$KILN_RUN_DIR/synced-MEMBER``, whose lines it copies to stderr (the job's log): only then
   does it exit, with the command's exit code, so the outputs and last checkpoints are in the store by the time
   the attempt ends.

``@STEPS@`` is replaced by the ``kiln_prepare`` and ``kiln_finish`` shell functions of the job.
"""

from __future__ import annotations

ENTRYPOINT = r"""#!/bin/sh
# Rendered by Kiln (kiln.backends.kubernetes): the entrypoint of the job's container. See docs/kubernetes.md.
set -u
conf="${KILN_CONF_DIR:-/etc/kiln}"
index="${JOB_COMPLETION_INDEX:-0}"
member="${KILN_ROLE:-worker}-$index"
procs="${KILN_PROCS:-1}"
run_dir="${KILN_RUN_DIR:-/kiln/run}"
stopped=0

# stop_all: SIGTERM to every process of the container but this shell (PID 1 leads the container's process
# group): the job's whole process tree, not only the `sh -c` that started it.
stop_all() {
    trap '' TERM INT
    kill -TERM 0 2>/dev/null
    trap on_term TERM INT
}
on_term() { stopped=1; stop_all; }
trap on_term TERM INT

load() { if [ -f "$1" ]; then . "$1"; fi; }

# step COMMAND...: run it as a child (a SIGTERM meanwhile reaches it through on_term); its exit status.
step() {
    "$@" &
    child=$!
    while :; do
        wait "$child"
        rc=$?
        kill -0 "$child" 2>/dev/null || break
    done
    return "$rc"
}

# command_step COMMAND...: the command once, or once per local process, each with its env file; the first
# process that fails stops the others.
command_step() {
    if [ "$procs" -le 1 ]; then
        load "$conf/$member-0.env"
        step "$@"
        return $?
    fi
    pids=""
    l=0
    while [ "$l" -lt "$procs" ]; do
        rm -f "$run_dir/rc-$l"
        (
            trap - TERM INT
            load "$conf/$member-$l.env"
            "$@"
            echo "$?" > "$run_dir/rc-$l.tmp" && mv "$run_dir/rc-$l.tmp" "$run_dir/rc-$l"
        ) &
        pids="$pids $!"
        l=$((l + 1))
    done
    result=0
    while [ "$result" = 0 ]; do
        finished=0
        l=0
        while [ "$l" -lt "$procs" ]; do
            if [ -f "$run_dir/rc-$l" ]; then
                finished=$((finished + 1))
                code=$(cat "$run_dir/rc-$l")
                if [ "$code" != 0 ] && [ "$result" = 0 ]; then
                    result=$code
                    echo "kiln: local process $l exited with $code; stopping the others" >&2
                    stop_all
                fi
            fi
            l=$((l + 1))
        done
        if [ "$finished" -ge "$procs" ]; then break; fi
        if [ "$stopped" = 1 ]; then result=143; fi
        if [ "$result" = 0 ]; then sleep 1; fi
    done
    for p in $pids; do wait "$p"; done
    return "$result"
}

@STEPS@

mkdir -p "$KILN_WORK_DIR" "$KILN_OUTPUT_DIR" "$KILN_CHECKPOINT_DIR" "$KILN_TENSORBOARD_DIR" "$run_dir" 2>/dev/null
load "$conf/gang.env"
if [ -f "$conf/ssh/id_ed25519" ]; then  # an MPI gang: mpirun reaches the other members over ssh
    ssh_dir="${HOME:-/root}/.ssh"
    mkdir -p "$ssh_dir" && chmod 700 "$ssh_dir"
    cp "$conf/ssh/id_ed25519" "$conf/ssh/id_ed25519.pub" "$conf/ssh/authorized_keys" "$ssh_dir/"
    chmod 600 "$ssh_dir/id_ed25519" "$ssh_dir/authorized_keys"
    printf 'Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' \
        > "$ssh_dir/config"
fi
# `import kiln; kiln.log(...)` works in the pod as on the local executor: unless the image's Python has a kiln
# package of its own, a one-module `kiln` (Kiln's metrics SDK, standard library only) goes on PYTHONPATH.
for py in python3 python; do
    if command -v "$py" >/dev/null 2>&1; then
        if ! "$py" -c "import kiln" >/dev/null 2>&1 && [ -f "$conf/kiln_sdk.py" ] &&
            mkdir -p "$run_dir/pylib/kiln" && cp "$conf/kiln_sdk.py" "$run_dir/pylib/kiln/__init__.py"; then
            export PYTHONPATH="$run_dir/pylib${PYTHONPATH:+:$PYTHONPATH}"
        fi
        break
    fi
done
cd "$KILN_WORK_DIR" || exit 1
if [ -n "${KILN_MPI_DAEMON:-}" ] && [ "$index" != 0 ]; then
    set -- /bin/sh -c "$KILN_MPI_DAEMON"
fi

kiln_prepare
code=$?
if [ "$code" != 0 ]; then
    echo "kiln: prepare_command exited with $code" >&2
elif [ "$stopped" = 0 ]; then
    command_step "$@"
    code=$?
fi
if [ "$stopped" = 0 ]; then
    KILN_EXIT_CODE=$code
    export KILN_EXIT_CODE
    kiln_finish
    finish_code=$?
    if [ "$finish_code" != 0 ]; then
        echo "kiln: finish_command exited with $finish_code" >&2
        if [ "$code" = 0 ]; then code=$finish_code; fi
    fi
fi
sync_timeout="${KILN_SYNC_TIMEOUT:-0}"
if [ "$sync_timeout" -gt 0 ] 2>/dev/null; then
    : > "$run_dir/ended-$member"
    waited=0  # tenths of a second: the sync of a small job's outputs takes well under one
    while [ ! -f "$run_dir/synced-$member" ] && [ "$waited" -lt "$((sync_timeout * 10))" ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    if [ -f "$run_dir/synced-$member" ]; then
        while IFS= read -r line; do echo "kiln-sync: $line" >&2; done < "$run_dir/synced-$member"
        read -r first < "$run_dir/synced-$member"
        case "$first" in
            error*) echo "kiln: uploading outputs and checkpoints to the store failed (kiln-sync lines above)" >&2 ;;
        esac
    else
        echo "kiln: the sync sidecar did not report within ${sync_timeout}s: outputs and checkpoints may be" \
            "missing from the store" >&2
    fi
fi
exit "$code"
"""


def steps(prepare: str | None, finish: str | None) -> str:
    """The ``kiln_prepare`` and ``kiln_finish`` functions: ``prepare``/``finish`` are shell-quoted argv
    (``shlex.join``), or None for a step the job does not have."""
    return (
        f"kiln_prepare() {{ {'step ' + prepare if prepare else 'return 0'}; }}\n"
        f"kiln_finish() {{ {'step ' + finish if finish else 'return 0'}; }}"
    )


def entrypoint(prepare: str | None, finish: str | None) -> str:
    return ENTRYPOINT.replace("@STEPS@", steps(prepare, finish))
