"""`run -- COMMAND`: the trainer as a child, its output passed through unchanged and read, its exit status ours."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import signal
import sys
import threading
import time
from typing import Any

from exporter.app import Exporter
from exporter.commands.base import UsageError, log
from exporter.commands.serving import STOP_GRACE_SECONDS, Listener, gpu_service, stop_signal, until_up, web_config
from exporter.commands.specs import check_run_label, log_specs
from exporter.config import LogSpec, default_run_name, load_config, parse_listen_address
from exporter.launch import Launch
from exporter.parsers.training import LAUNCH_ENV
from exporter.sources.priority import lower_this_thread

SETUP_GRACE_SECONDS = 10.0  # `run`, the trainer gone: how long its exporter may take to set up, and read the rest


def _child_run_name(argv: list[str]) -> str:
    """`python train.py` -> `train`: the first argument that names a script, else the program's name."""
    for a in argv:
        if not a.startswith("-") and os.path.splitext(a)[1] in (".py", ".sh"):
            return default_run_name(a)
    return default_run_name(argv[0]) or "run"


def main(args: argparse.Namespace) -> int:
    """The trainer first: it starts before anything of the exporter, which comes up beside it (a bad config, a
    taken port, an exporter bug are logged and retried while the trainer's output passes through unchanged); the
    exit status is the trainer's."""
    from exporter.parsers.failures import exit_text
    from exporter.sources.child import FORWARDED_SIGNALS, SIGNAL_CHECK_SECONDS, ChildOutput
    from exporter.stopping.stopper import STOPPED_EXIT
    if args.linger < 0:
        raise UsageError("--linger must be 0 or more seconds")
    stop, ended = threading.Event(), threading.Event()  # ended: the trainer's output was all read
    started: list = []
    early: list[int] = []  # signals that came before the trainer was there to take them
    taken: list[int] = []  # every signal we took

    def forward(signum: int, _frame) -> None:
        taken.append(signum)
        if started:
            started[0].forward(signum)
        else:
            early.append(signum)
        stop.set()
    # the token the trainer's feed will carry (launch.py): in its environment before it starts, so a feed the
    # trainer writes beside its console joins its run
    token = secrets.token_hex(8)
    os.environ[LAUNCH_ENV] = token

    for sig in FORWARDED_SIGNALS:  # before the trainer starts: it may print and be signalled at once
        signal.signal(sig, forward)
    try:
        child = ChildOutput(args.child, relay_log=True, log_format=args.log_format)
    except OSError as e:
        raise UsageError(f"cannot start {args.child[0]}: {e.strerror or e}") from None
    started.append(child)
    for signum in early:
        child.forward(signum)
    relay = _relay_log(child.feed.log_fd)
    log.info("run: trainer started (pid %d)", child.pid)
    side: dict[str, Any] = {"setup_done": threading.Event()}
    exporter_side = threading.Thread(target=_run_exporter, args=(args, child, ended, side, token), name="exporter",
                                     daemon=True)
    exporter_side.start()
    try:
        status = child.exit_status()  # the handlers forward our signals meanwhile
        before_exit = len(taken)
        # the trainer's lines are over: ours go straight to stderr from now on, and the copier, which writes the ones
        # it holds, sees the end of them (it waits for that before it exits: none is lost in its pipe)
        _end_relay(relay)
        if not child.wait_output(5.0):
            log.warning("the trainer exited but a process it started still holds its output open; not waiting for it")
        ended.set()
        # its setup (imports, config) first: ended now, it reads what the trainer left and stops; a thread left
        # inside an import at the interpreter's exit can hang it
        grace = STOP_GRACE_SECONDS if stop.is_set() else SETUP_GRACE_SECONDS  # a signal: be quick
        side["setup_done"].wait(grace)
        exporter_side.join(grace)
        stopper = side["exporter"].trainer_stopper if "exporter" in side else None
        stopped = stopper is not None and stopper.stopped  # early_stop.action signal: we stopped it, it did not fail
        if stopped:
            stopper.close()
            log.warning("run: the exporter stopped the trainer at step %s (%s); %s; exit status %d",
                        stopper.stop["step"], stopper.stop["reason"], exit_text(status), STOPPED_EXIT)
            status = STOPPED_EXIT
        elif status:
            log.warning("run: %s", exit_text(status))
        # after its output was read: its verdict (crashed or not) for the linger's scrapes; a trainer ended by a
        # signal we forwarded (the pod stopping) or stopped by us was stopped, not crashed
        if "exporter" in side and not before_exit and not stopped:
            side["exporter"].trainer_exited(side["run"], status)
        # keep serving for a last scrape; a signal that came since the trainer exited is ours (the pod stops): none
        if "listener" in side and args.linger and len(taken) == before_exit:
            stop.clear()
            # in short steps: a SIGTERM that the kernel hands to another thread still ends the linger (its handler
            # runs in this thread, between the steps)
            until = time.monotonic() + args.linger
            while not stop.is_set() and (left := until - time.monotonic()) > 0:
                stop.wait(min(left, SIGNAL_CHECK_SECONDS))
        return status
    finally:
        ended.set()
        if "listener" in side:
            side["listener"].shutdown()
        if "gpu" in side:
            side["gpu"].stop()
        child.feed.stop()


def _run_exporter(args: argparse.Namespace, child, ended: threading.Event, side: dict[str, Any], token: str) -> None:
    """`run`'s exporter, in its own thread: set up (retried), listen (retried), then read the trainer's output
    until it `ended`. Nothing here can stop or slow the trainer: its output is the copier's."""

    def setup():
        cfg = load_config(args.config)
        web = web_config(args)
        check_run_label(args.run)
        # --run names the trainer's run here; a --log beside it is named by its file (or by the config)
        child_spec = LogSpec("-", args.run or cfg.run or _child_run_name(args.child), args.format)
        specs = log_specs(cfg, args.logs, None, args.format, child=child_spec)
        listen = args.listen_address or cfg.listen_address
        parse_listen_address(listen)
        exporter = Exporter(cfg, specs[1:], Launch(child_spec.run, token))  # the feed of this launch: one run
        exporter.stop_signal = stop_signal(cfg)
        from exporter.stopping.setup import stop_child  # early_stop.action signal: the trainer we started
        stop_child(exporter, child_spec.run, child.pid, lambda: child.proc.poll() is None)
        exporter.add_input(child_spec, child.feed, first=True)
        exporter.supervise(child_spec.run)
        gpu = gpu_service(cfg, args.no_gpu)
        return exporter, Listener(exporter, listen, gpu, web, retry=True), gpu, child_spec, cfg

    try:
        exporter, side["listener"], gpu, child_spec, cfg = until_up("run", setup, ended.is_set)
    except Exception as e:
        log.error("run: the exporter cannot start (%s); the trainer ran without it", e)
        return
    finally:
        side["setup_done"].set()
    side["exporter"], side["run"] = exporter, child_spec.run
    if gpu is not None:
        side["gpu"] = gpu
        gpu.start()
    log.info("run: the trainer's output read as run %s", child_spec.run)
    lower_this_thread(child.pid)  # parsing takes the CPU the trainer leaves
    interval = min(cfg.poll_interval_seconds, 0.25)
    failures = 0
    while True:
        last = ended.is_set()  # after the trainer's output ended: what is left, then stop
        try:
            exporter.poll_once()
        except Exception:  # a parsing bug costs metrics, never the trainer's output or its exit status
            failures += 1
            if failures == 1:
                log.exception("ingest failed; the trainer's output still passes through (further failures are "
                              "only counted)")
        if exporter.catching_up:
            ended.wait(0.002)  # let a waiting scrape take the lock
            continue
        if last:
            return
        ended.wait(interval)


class _RelayStream:
    """`run`: the exporter's log lines go to the copier, which writes them between the trainer's lines, never
    inside one. Once it is gone (the trainer's output ended), straight to standard error."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd
        os.set_blocking(fd, False)
        self.dropped = 0

    def write(self, text: str) -> None:
        if self.fd is not None:
            try:
                data = text.encode("utf-8", "replace")
                n = os.write(self.fd, data)
                if n < len(data):  # a line longer than the pipe's free room: its rest, however long it takes
                    os.set_blocking(self.fd, True)
                    os.write(self.fd, data[n:])
                    os.set_blocking(self.fd, False)
                return
            except BlockingIOError:  # the copier holds enough of ours: this line is dropped, not waited for
                self.dropped += 1
                return
            except OSError:
                os.close(self.fd)
                self.fd = None
        sys.stderr.write(text)

    def flush(self) -> None:
        if self.fd is None:
            sys.stderr.flush()


def _relay_log(fd: int | None) -> _RelayStream | None:
    if fd is None:
        return None
    stream = _RelayStream(fd)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(stream)  # type: ignore[arg-type]
    return stream


def _end_relay(stream: _RelayStream | None) -> None:
    """Back to stderr, then the relay's pipe closed: setStream takes each handler's lock, so no line is being
    written to the pipe once it returns."""
    if stream is None:
        return
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
            handler.setStream(sys.stderr)
    if stream.fd is not None:
        with contextlib.suppress(OSError):
            os.close(stream.fd)
        stream.fd = None
    if stream.dropped:  # lines the copier's full pipe refused: said once the log is ours again
        log.warning("%d of the exporter's log lines were dropped while the trainer's output was passing through "
                    "(the copier's pipe for them was full)", stream.dropped)


