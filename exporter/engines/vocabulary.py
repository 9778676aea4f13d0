"""The cross-engine vocabulary: families of lines every engine prints in its own words.

No I/O, no code paths: ``exporter.core.classify`` checks these after an engine's own profile,
which adds to them and can override them (a profile's benign line shadows a shared fatal
one; a profile's marker shadows a shared ready line). With no profile at all
(``replay-log --engine generic``) this layer alone has to carry the verdict, so each pattern
names a *family* of wordings (the next engine's "insufficient KV cache memory" as well as
the fixture's), never one fixture line.

Fatal patterns here only fire on lines whose own level field is warning or worse, or that
carry no level at all: an ``INFO`` line that mentions memory or NCCL is a report, not a
failure (vllm-18-ready's "Free memory on device ... Desired GPU memory utilization",
sglang-17-crash's "NCCL INFO ncclCommInitRank ... Init COMPLETE").
"""

from __future__ import annotations

import re
from typing import Final

from exporter.base.model import FailureReason, Phase
from exporter.engines.profile import LogPattern, benign, fatal, marker, progress, wrapper

_OOM = FailureReason.OOM
_NCCL = FailureReason.NCCL
_CRASH = FailureReason.CRASH
_EXITED = FailureReason.EXITED

#: Memory exhaustion: GPU, host, KV cache, allocator, executor.
MEMORY: Final[tuple[LogPattern, ...]] = (
    # tgi-02-oom ("CUDA out of memory"), sglang-03-oom ("HIP out of memory"), tgi-07-oom
    # ("(out of memory)"), llamacpp-03-oom ("cudaMalloc failed: out of memory")
    fatal(r"\bout of (?:device |GPU |host |shared )?memory\b|OutOfMemory|\bOOM[- ]?kill", _OOM),
    # fixtures README.md: an OOM kill leaves no engine line, only systemd's "Failed with result
    # 'oom-kill'" or the kernel's "Out of memory: Killed process"
    fatal(
        r"CUDA_ERROR_OUT_OF_MEMORY|hipErrorOutOfMemory|std::bad_alloc|Cannot allocate memory", _OOM
    ),
    # llamacpp-03-oom, llamacpp-08-oom ("failed to allocate CUDA0 buffer", "unable to allocate
    # ROCm0 buffer"): an allocator that could not get memory, buffer or a sized block
    fatal(
        r"\b(?:failed|unable|not able) to allocate\b[^,;]{0,60}?"
        r"(?:\bmemory\b|\bbuffer\b|\btensor|\bcache\b|\d\s?[KMGT]i?B\b)",
        _OOM,
    ),
    # sglang-15-oom ("leave no GPU memory for the KV cache"), vllm ENGINES.md ("No available
    # memory for the cache blocks"): no / not enough / insufficient memory, any device
    fatal(
        r"\b(?:no|not enough|insufficient|no available|no free)\s+(?:\w+\s+){0,2}memory\b"
        r"|\bmemory\b.{0,40}?\b(?:insufficient|exhausted)\b",
        _OOM,
    ),
    # vllm-22-oom, vllm-23-oom ("Free memory on device ... is less than desired GPU memory
    # utilization"): free memory below what the configured utilisation asks for
    fatal(
        r"\bmemory\b.{0,80}?\b(?:is )?(?:less|lower|smaller) than\b.{0,40}?"
        r"\b(?:desired|required|requested|configured|needed|utili[sz]ation)",
        _OOM,
    ),
    # vllm-25-oom ("max seq len (29000) is larger than the maximum number of tokens that can
    # be stored in KV cache"): the KV cache cannot hold one sequence
    fatal(
        r"\b(?:larger|more|greater) than\b.{0,60}?\b(?:stored|fit|held) in (?:the )?KV[ -]?cache"
        r"|\bKV[ -]?cache\b.{0,60}?\b(?:does not fit|cannot fit|too small|not enough)",
        _OOM,
    ),
    # vllm-04-oom ("18.35 GiB KV cache is needed, which is larger than the available KV cache
    # memory (8.72 GiB)"): what a check needs set against what is left, either way round
    fatal(
        r"\b(?:needed|required|requested|needs|requires)\b[^.;]{0,40}?"
        r"\b(?:larger|more|greater|bigger) than (?:the )?(?:available|free|remaining)\b"
        r".{0,40}?(?:memory|cache|VRAM|RAM\b|\d ?[KMGT]i?B\b)"
        r"|\bexceeds? (?:the )?(?:available|free|remaining) (?:\w+ ){0,2}(?:memory|VRAM)",
        _OOM,
    ),
)

#: Collective-communication failures: NCCL, RCCL, HCCL, Gloo, MPI, and their timeouts.
COLLECTIVE: Final[tuple[LogPattern, ...]] = (
    # vllm-08/10/26-nccl, sglang-16-nccl ("NCCL error: unhandled system error"), mindie-01-nccl
    # ("HcclCommInitRootInfo failed"), sglang-08-nccl ("NCCL WARN ... Connect to ... failed")
    fatal(
        r"\b(?:NCCL|RCCL|HCCL|Gloo|MPI)\b(?: WARN\b)?.{0,160}?"
        r"\b(?:error|fail(?:ed|ure|s)?|timed? ?out|abort(?:ed|ing)?)\b",
        _NCCL,
    ),
    fatal(r"\b[nrh]ccl\w*(?:Error|\s+fail(?:ed|ure)?\b)|\b[nrh]ccl\w* is null\b", _NCCL),
    # tgi-04-nccl, tgi-12-nccl ("Watchdog caught collective operation timeout")
    fatal(r"\bcollective operation\b.{0,40}?\btime|ProcessGroup\w*.*?Watchdog caught", _NCCL),
    # sglang-19-nccl ("[Gloo] Rank 8 is NOT connected to: [1]"): a rank missing from the
    # rendezvous; the launcher's start timeout that follows is its consequence, not the cause.
    # torch.distributed's store and rendezvous errors ("DistStoreError: Timed out after 900
    # seconds waiting for clients. 1/2 clients joined", "RendezvousTimeoutError") are the same
    fatal(
        r"\b(?:NCCL|RCCL|HCCL|Gloo|MPI)\b.{0,80}?\b(?:rank|peer)s?\b.{0,40}?\bnot connected\b"
        r"|\bDist(?:Store|Network)Error\b|\bRendezvous\w*(?:Error|Timeout)\b"
        r"|\brendezvous\b.{0,60}?\b(?:timed? ?out|failed)\b|\b\d+/\d+ clients joined\b",
        _NCCL,
    ),
)

#: Native aborts and signals: CUDA/ROCm/HIP/HSA errors, ggml aborts, segfaults, C++ throws.
NATIVE: Final[tuple[LogPattern, ...]] = (
    # trtllm-03-crash ("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered")
    fatal(
        r"illegal (?:memory access|address|instruction)|\bCUDA_ERROR_\w+|\bcudaError\w+"
        r"|\bhipError\w+|\bHSA_STATUS_ERROR\w*|device-side assert"
        r"|\b(?:CUDA|HIP|ROCm|HSA|CANN|ACL) (?:driver |runtime )?error\b",
        _CRASH,
    ),
    # tgi-12-nccl ("terminate called after throwing an instance of"), triton-04-crash
    # ("Assertion failed: Failed to deserialize cuda engine"), llama.cpp's ggml_abort
    fatal(
        r"Segmentation fault|\bSIG(?:SEGV|ABRT|BUS|ILL|FPE)\b|core dumped|Fatal Python error"
        r"|terminate called (?:after throwing|without an active exception|recursively)"
        r"|\bAssertion\b.{0,80}?\bfailed\b|\bggml_abort\b"
        r"|GGML_ASSERT|double free or corruption|stack smashing detected",
        _CRASH,
    ),
    # tgi-07-oom: a Rust panic (its reason may name the memory family, checked first)
    fatal(r"\bthread '[^']*' panicked at\b", _CRASH),
    # issue 33: the runtime itself giving up, in each language's words, wherever it comes in
    # a start (a panic just after the listening line is a start that crashed): Go's runtime
    # ("panic: runtime error: invalid memory address", "fatal error: concurrent map writes",
    # then "goroutine 1 [running]:"), Rust's ("fatal runtime error: stack overflow", "thread
    # 'main' has overflowed its stack"), and an abort as glibc or a shell reports it ("Aborted
    # (core dumped)", "line 3: 4242 Aborted"). A line may carry a timestamp or a rank prefix;
    # Go's recovered per-request panic ("http: panic serving 10.0.0.1:5: ...") is not one
    fatal(
        r"(?:^|[ \t])(?:panic|fatal error): \S|(?:^|[ \t])goroutine \d+ \[running\]:"
        r"|\bfatal runtime error: |\bhas overflowed its stack\b"
        r"|^(?:\S+ )?Aborted(?: \(core dumped\))?\s*$|: line \d+: +\d+ Aborted\b",
        _CRASH,
    ),
)

#: A child killed from outside (SIGKILL: the kernel's OOM killer, a cgroup limit, kill -9), as
#: the supervisor reports it. Checked before the launcher family, whose exit codes it refines.
KILLS: Final[tuple[LogPattern, ...]] = (
    # ollama-03-oom ("llama runner process has terminated: signal: killed"): Go's os/exec
    # wording; Python's ("died with <Signals.SIGKILL: 9>", "exitcode: -9"), systemd's
    # ("code=killed, status=9/KILL"), bash's ("line 3: 4242 Killed") and 128+9 exit codes
    fatal(
        r"\bsignal: killed\b|\bSIGKILL\b|\bstatus=9/KILL\b|\b(?:by |received )?signal 9\b"
        r"|\bexit ?(?:code|status)[ :=]*(?:-9|137)\b|: line \d+: +\d+ Killed\b",
        FailureReason.KILLED,
    ),
)

#: systemd's unit results (its service_result table) by the reason each names; "timeout"
#: and "watchdog": TimeoutStartSec= or WatchdogSec= ran out, systemd gave up waiting.
_UNIT_RESULTS: Final = (
    ("exit-code|resources|protocol|start-limit-hit", _EXITED),
    ("signal|core-dump", _CRASH),
    ("timeout|watchdog", FailureReason.TIMEOUT),
)

#: systemd's own lines about a unit (PID 1's, read with the unit's journal as ``UNIT=``),
#: worded in systemd's src/core and unchanged for years: ``unit_log_process_exit`` ("Main
#: process exited, code=%s, status=%i/%s") and ``unit_log_failure`` ("Failed with result
#: '%s'."). They tell that the unit's process ended when no process sample caught it (a
#: start over in milliseconds). Its other endings belong to other families: a kill
#: (status=9/KILL) to ``KILLS``, an OOM kill ('oom-kill') to ``MEMORY``, an operator's stop
#: (status=15/TERM) to ``STOPS``, a clean exit (status=0/SUCCESS) to none.
SYSTEMD: Final[tuple[LogPattern, ...]] = (
    # issue 33, service.c: "vllm.service: Main process exited, code=exited, status=1/FAILURE";
    # 203/EXEC: the ExecStart= binary could not be run at all
    fatal(r"\b(?:Main|Control) process exited, code=exited, status=[1-9]\d*/", _EXITED),
    # issue 33, service.c: a crash signal, with a core dump ("code=dumped, status=11/SEGV")
    # or without
    fatal(
        r"\bprocess exited, code=(?:dumped, status=|killed, status=\d+/"
        r"(?:SEGV|ABRT|BUS|ILL|FPE|SYS|TRAP)\b)",
        _CRASH,
    ),
    # issue 33, unit.c ("Failed with result '%s'."): the unit's result, by what it names
    *(fatal(rf"\bFailed with result '(?:{names})'", why) for names, why in _UNIT_RESULTS),
)

#: Launcher and supervisor messages: a shard, worker or server that failed, exit codes.
LAUNCHER: Final[tuple[LogPattern, ...]] = (
    # tgi-02-oom ("Shard 0 failed to start"), triton-03-crash ("failed to load all models"),
    # llamacpp-09-crash ("exiting due to model loading error"), tgi-14-crash ("Error when
    # initializing model"), vllm-27-crash ("EngineCore failed to start"); Ray Serve's
    # deployment_state.py ("The deployment failed to start 3 times in a row"). The noun is a
    # word of its own: vllm-37-ready's logger "model_hosting_container_standards - ... Failed
    # to load function" is a SageMaker hook it does without
    fatal(
        r"\b(?:shard|worker|engine|core|server|runner|scheduler|executor|backend|model|process"
        r"|replica|deployment|actor|application)"
        r"[A-Za-z]*\b.{0,40}?\b(?:failed to (?:start|initiali[sz]e|launch|load)|initiali[sz]ation"
        r" failed|(?:could|can) ?not (?:start|be loaded)|crashed\b|died unexpectedly)",
        _CRASH,
    ),
    fatal(
        r"\b(?:failed to load|error (?:when |while )?(?:loading|initiali[sz]ing)) (?:the )?"
        r"(?:all )?models?\b|\bexiting due to\b.{0,40}?\berror|error: creating server",
        _CRASH,
    ),
    # tgi-02-oom, tgi-13-crash ("Error: ShardCannotStart"), tgi-07-oom ("Error: WebserverFailed"):
    # a launcher's main returning its error variant
    fatal(r"^Error: [A-Z]\w*(?:CannotStart|Failed|Crashed|Died)\b", _CRASH),
    # issue 33: Rust's anyhow/eyre (mistral.rs, TEI: "Error: Could not create backend", then
    # a "Caused by:" chain) and Go's cobra print a failed main's error bare at the start of a
    # line; a server task ending in error ("server shutdown with error", "exited with error")
    fatal(
        r"^Error: \S|^Caused by:\s*$"
        r"|\bshut ?down with (?:an )?error\b|\bexited with (?:an )?error\b",
        _CRASH,
    ),
    # triton-02-crash: Triton's model status table (core server.cc) with a model whose state
    # carries an error status ("| name | 1 | UNAVAILABLE: Internal: ..."); Triton's Status
    # codes name what broke, so an "UNAVAILABLE: unloaded" row after a clean stop stays quiet
    fatal(
        r"\|\s*(?:UNAVAILABLE|FAILED|ERROR): (?:Internal|Invalid argument|Not found|Unknown"
        r"|Unsupported|Unavailable|Already exists|Cancelled)\b",
        _CRASH,
    ),
    # llamacpp-09-crash ("llama_server exited with code 1", "exited before becoming ready")
    fatal(r"\bexit(?:ed)? (?:with )?(?:exit )?(?:code|status)[ :=]*[1-9]|exited before", _CRASH),
    # vllm-28-crash ("vllm: command not found"): the server never ran
    fatal(r": command not found\b|: No such file or directory$|exec format error", _CRASH),
)

#: Every shared fatal family, in precedence order (the classifier sorts oom, nccl, crash).
FATAL: Final[tuple[LogPattern, ...]] = (
    *MEMORY,
    *COLLECTIVE,
    *KILLS,
    *NATIVE,
    *SYSTEMD,
    *LAUNCHER,
)

#: Words at least one of which every ``FATAL`` pattern needs: a line without any skips the
#: families (two thirds of all lines; the families' own alternation costs ten times more).
#: Extend it with each new family (tests check it over the corpus).
FATAL_HINT: Final = re.compile(
    r"memor|alloc|oom|cache|ccl|gloo|mpi|collective|watchdog|error|fail|fault|sig|core dump"
    r"|terminat|assert|abort|panic|illegal|double free|smash|crash|died|exit|not start"
    r"|not be loaded|not found|no such|available|needed|required|connected|rendezvous|clients"
    r"|kill|^Error: |^Caused by|unavailable|goroutine|overflowed",
    re.IGNORECASE,
)

#: An operator's stop: signals from outside end the process, they are not a failed start.
STOPS: Final[tuple[LogPattern, ...]] = (
    # sglang-05-ready ("crashed with exit code -15", "SIGQUIT received"), vllm-29-hang
    # ("*** SIGTERM received"), vllm-31-other ("KeyboardInterrupt: terminated")
    benign(
        r"(?:exit(?:ed)? (?:with )?(?:exit )?(?:code|status)|signal)[ :=]*(?:-15|-2|143|130)\b"
        r"|\bSIG(?:TERM|INT|QUIT|HUP)\b|\bKeyboardInterrupt\b|\bCancelledError\b"
        r"|received (?:a )?(?:shutdown|termination|stop) (?:signal|request)"
    ),
    # issue 33: systemd stopping the unit ("Main process exited, code=killed,
    # status=15/TERM"), the signals the systemd.service docs count as a clean exit
    benign(r"\bprocess exited, code=killed, status=(?:15/TERM|2/INT|1/HUP|13/PIPE)\b"),
)

#: Noise every engine's log carries; none of it says anything about the cold start.
BENIGN: Final[tuple[LogPattern, ...]] = (
    # DESIGN.md (CUTE_DSL package walk)
    benign(
        r"CUTE_DSL|Unexpected error during package (?:walk|packing)|cutlass\.cute\.experimental"
    ),
    # vllm-05-ready, sglang-01-crash ("[Gloo] Rank 0 is connected to 7 peer ranks")
    benign(r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks"),
    # vllm-05-ready: TensorFlow/XLA imported next to torch
    benign(r"Unable to register cu(?:FFT|DNN|BLAS) factory|computation placer already registered"),
    benign(
        r"absl::InitializeLog\(\)|oneDNN custom operations are on|TensorFlow binary is optimized"
    ),
    benign(r"^To enable the following instructions: "),
    # vllm-05-ready, sglang-03-oom ("`torch_dtype` is deprecated!"), vllm-18-ready
    benign(r"\bis deprecated\b|DeprecationWarning|FutureWarning|\[DEPRECATED\]"),
    # sglang-01-crash, sglang-05-ready: the source line Python prints under a UserWarning
    benign(r"^\s*_?warnings\.warn\("),
    # sglang-05/07-ready/other, vllm-03-other: Hugging Face Hub rate-limit notice
    benign(r"sending unauthenticated requests to the HF Hub"),
    # vllm ENGINES.md "alive, silent": printed every 60 s whether or not work progresses
    benign(r"No available shared memory broadcast block found"),
    # issue 5: printed on a normal SIGTERM stop of vLLM; vllm-17-ready's shutdown
    benign(r"\bEngineDeadError\b|destroy_process_group\(\) was not called"),
    # sglang-07-other: multiprocessing shutdown noise after an operator's kill
    benign(r"resource_tracker: There appear to be \d+ leaked"),
)

#: Lines that announce a traceback whose final exception line is the cause of the failure.
WRAPPERS: Final[tuple[LogPattern, ...]] = (
    # sglang-01-crash ("Scheduler hit an exception"), vllm-10-nccl ("EngineCore hit an
    # exception"), tgi-09-crash ("Method Warmup encountered an error")
    wrapper(r"\b(?:hit|encountered|raised|caught) an? (?:unhandled |fatal )?(?:exception|error)\b"),
    # vllm-08-nccl ("Exception in worker VllmWorkerProcess while processing method")
    wrapper(r"\bException in (?:worker|thread|process|background)\b"),
    # Ray Serve's controller (deployment_state.py: "Exception in Replica(...), the replica will
    # be stopped.", logged with its traceback): a serving framework failing the replica that
    # runs the engine; the traceback's last line names why
    wrapper(
        r"\bException in (?:replica|actor|deployment|task)\b"
        r"|\b(?:replica|deployment|actor|worker)\b.{0,120}?"
        r"\bwill be (?:stopped|killed|terminated)\b"
    ),
    # vllm-22-oom ("EngineCore failed to start."): a component's failure announced bare, its
    # cause in the traceback that follows (an oom there beats this line's crash)
    wrapper(r"^.{0,120}\b\w+ failed to (?:start|initiali[sz]e)\.?\s*(?:Traceback.*)?$"),
)

#: Ready announcements and the progress bar most PyTorch loaders share.
MARKERS: Final[tuple[LogPattern, ...]] = (
    # issue 33: systemd's start job for the unit (job.c, "Starting %s...", the unit's
    # description): a new run begins, and the lines after it are that run's
    marker(r"^Starting \S.{0,200}\.\.\.$", "unit_start", Phase.STARTING),
    # vllm-05/06-ready, sglang-04-ready: the shard bar of Hugging Face checkpoints, and the
    # same bar drawn by a fast loader ("Loading safetensors using Runai Model Streamer: ...")
    progress(
        r"Loading (?:safetensors |pt )?(?:checkpoint shards|using \w+(?: \w+){0,3}?)\s*:\s*"
        r"\d+% Completed \| "
        r"(?P<done>[\d.]+[KMGT]?)/(?P<total>[\d.]+[KMGT]?)",
        "shards",
        Phase.LOADING,
        per_model=True,
    ),
    # lmdeploy-01-ready, trtllm-01-ready, vllm-06-ready: uvicorn serving
    marker(r"Uvicorn running on|Application startup complete", "ready", Phase.READY),
    # llamacpp-01/07-ready ("server is listening on http://", "listening on http://"); a
    # bare "HTTP server is listening, hostname" (llamacpp-08-oom) comes before the load
    marker(
        r"\b(?:server is )?listening on (?:https?://|\[?[\w.:-]+\]?:\d+)|\bserver is ready\b"
        r"|\bready to (?:roll|serve|accept)|\brunner started\b|\bstartup complete\b",
        "ready",
        Phase.READY,
    ),
    # issue 33: the same, worded by servers with no profile: waitress and older mistral.rs
    # ("Serving on http://0.0.0.0:1234"), KoboldCpp's koboldcpp.py ("Please connect to
    # custom endpoint at http://localhost:5001"), LocalAI's Fiber OnListen hook ("LocalAI API
    # is listening!"), Xinference's supervisor ("Xinference successfully started. Endpoint:
    # http://..."), "... is ready at http://", and gRPC/HTTP front ends started after the
    # models (Triton's core server "Started GRPCInferenceService at 0.0.0.0:8001")
    marker(
        r"\bServing (?:on|at) (?:https?://|\[?[\w.:-]+\]?:\d+)"
        r"|\b(?:please|you can(?: now)?) connect to\b.{0,60}?\bat https?://"
        r"|\bAPI is (?:listening|running|ready)\b|\bsuccessfully started\b.{0,40}?https?://"
        r"|\bis (?:ready|up|running|available) (?:at|on) https?://"
        r"|\bStarted \w*(?:HTTP|GRPC|REST|API)\w* ?(?:Service|Server)? at\b",
        "ready",
        Phase.READY,
    ),
)

#: Lines that say a rank or node waits on others (rendezvous, collective or store init): not
#: fatal, not progress, but what a start waiting on its peers prints (vllm-29-hang: "[Gloo]
#: Rank 8 is NOT connected"; torch.distributed's "Waiting in store based barrier"). The core
#: counts them as the ``peers`` bound's evidence, so they pass the log screen as events.
PEER_WAIT: Final = re.compile(
    r"rendezvous|store[- ]based barrier|while trying to connect to"
    r"|waiting for (?:all |other |the )?(?:\d+ )?(?:ranks?|peers?|nodes?)\b"
    r"|waiting for creating a placement group|is NOT connected to|NCCL INFO Bootstrap",
    re.IGNORECASE,
)

#: Fast weight loaders (ENGINES.md section 8): which one a line names, as a bounded name.
#: Family-worded: the loader's name in its spellings, whatever the engine wraps it in.
LOADERS: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    # "Loading safetensors using Runai Model Streamer", "[RunAI Streamer] Overall time to
    # stream", vLLM's "--load-format runai_streamer"
    (
        re.compile(r"\bRun:?ai[ _-]?(?:Model[ _-]?)?Streamer|\brunai_streamer", re.I),
        "runai-streamer",
    ),
    # "Loading safetensors using Fastsafetensor loader", "fastsafetensors"
    (re.compile(r"\bfast[ _-]?safetensors?\b", re.I), "fastsafetensors"),
    # "Deserialized 15.0 GB in 4.23s, 3.5 GB/s" (tensorizer's summary), "TensorizerLoader"
    (re.compile(r"\btensorizer|\bDeserialized [\d.]+ ?[KMGT]i?B in ", re.I), "tensorizer"),
    # "Loading safetensors using InstantTensor loader: 9% Completed | 13.3G/155G"
    (re.compile(r"\binstant[ _-]?tensor", re.I), "instanttensor"),
)
#: A loader's summary: how much in how long, at what rate (any of the three may be missing).
LOADER_SUMMARY: Final = re.compile(
    r"\b(?:stream(?:ed)?|deserialized|loaded|read)\b[^0-9]{0,12}"
    r"(?P<size>\d+(?:\.\d+)? ?[KMGT]i?B)\b.{0,60}?"
    r"(?:\bin\b|:)\s*(?P<seconds>\d+(?:\.\d+)?) ?s(?:ec(?:onds?)?)?\b"
    r"(?:[^0-9]{0,6}(?P<rate>\d+(?:\.\d+)? ?[KMGT]i?B) ?/ ?s)?",
    re.I,
)

#: Frames of a traceback that name a family: the cause chain counts, not only its last line.
CHAIN_HINTS: Final[tuple[tuple[re.Pattern[str], FailureReason], ...]] = (
    # sglang-16-nccl (PyNcclCommunicator -> ncclCommInitRank frames)
    (
        re.compile(r"\bpy[nrh]ccl\w*|\b[nrh]ccl(?:Comm|Group|AllReduce)\w*|ProcessGroup[NH]CCL"),
        _NCCL,
    ),
)
