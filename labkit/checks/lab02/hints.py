"""Lab 02's hints: one per mistake, each used from here (tests hold them distinct)."""
from __future__ import annotations

# ---------------------------------------------------------------- Exercise 2.1: Recompute
NO_GRAD_FORWARD = ("run fn under torch.no_grad() in forward, so it records no graph and autograd saves none "
                   "of its activations")
ENABLE_GRAD = ("recompute under torch.enable_grad(): backward runs with grad mode off, so the rerun of fn "
               "recorded no graph to back-propagate through")
DETACH = ("rerun fn on copies of the saved inputs cut from their history, each requiring grad as its original "
          "did; otherwise the rerun's graph reaches back into the layers before the checkpoint and they get their "
          "gradients twice")
SAVE_ONLY_INPUTS = ("save only the inputs, with ctx's own method for saving tensors; fn's outputs and "
                    "intermediates are exactly what backward recomputes")
SAVE_INPUTS = ("save the inputs with ctx's own method for saving tensors and read them back from ctx.saved_tensors "
               "in backward")
N_GRADS = "return one gradient per argument of forward: None for fn, then one per input"
ORDER = ("return the gradients in the order of forward's arguments: None for fn, then each input's .grad in "
         "the order the inputs came")
NO_PARAM_GRADS = ("fn's parameters got no gradient: back-propagate grad_outputs through the rerun "
                  "(torch.autograd.backward(outputs, grad_outputs))")
STOPPED = ("the gradient stopped at the checkpoint: the inputs you rerun fn on must require grad where the "
           "originals did, and backward must return their .grad")
EXACT = ("gradients must equal the plain run bit for bit: rerun the same fn on the saved inputs, "
         "back-propagate grad_outputs through it and return each input's .grad")
NON_TENSOR_OUT = ("fn may return non-tensors (None, an int) and tensors that require no grad (an argmax): "
                  "back-propagate only through the outputs that are tensors and require grad, pairing each with its "
                  "grad_output")
FORWARD_SPEC = "forward(ctx, fn, *args) saves args, runs fn(*args) and returns its output"
BACKWARD_SPEC = "backward(ctx, *grad_outputs) reruns fn on the detached inputs and returns their gradients"
ONCE_FORWARD = "forward runs fn once and returns its output"
TWICE = "run fn exactly twice per step: once in forward, once in backward"
REFUSE = ("keep the given line refuse_unsupported_backward() first in backward: the reentrant design cannot serve "
          "torch.autograd.grad(), backward(inputs=...) or create_graph=True, and must say so before it runs "
          "anything")

# ---------------------------------------------------------------- Exercise 2.2: RNG replay
RNG_RESTORED = "gradients differ only where dropout acts: was the RNG state restored before recomputing?"
RNG_ON_RECOMPUTE = ("RecomputeRNG is wrong even without dropout: make Exercise 2.1 pass first (RecomputeRNG is "
                    "built on your Recompute)")
RNG_SPEC = ("stash_rng(*args) returns the generator states; restored_rng(state) is a context manager that runs "
            "its block from them")
RNG_CONTEXT = "restored_rng must be a context manager: decorate it with @contextmanager and yield once inside"
RNG_SNAPSHOT = ("stash_rng must return a snapshot (torch.get_rng_state()) and restored_rng must set it "
                "(torch.set_rng_state) before running the block")
RNG_CONTINUE = ("after the block the generator must continue as if the block had not run: save the current state "
                "on entry and put it back on exit (torch.random.fork_rng does both)")
RNG_CUDA = ("stash the generator of each CUDA device among the inputs too (torch.cuda.get_rng_state(device)) and "
            "set it in restored_rng (torch.cuda.set_rng_state(state, device)); fork_rng(devices=[...]) puts it back")
RNG_AFTER_STEP = ("after backward the generator must continue where training left it: restore the state only for "
                  "the recompute (torch.random.fork_rng around it)")
RECOMPUTE_RNG_SPEC = ("RecomputeRNG runs like your Recompute, with the RNG state stashed in forward and restored "
                      "in backward")

# ---------------------------------------------------------------- Exercise 2.3: autocast
AMP_SPEC = ("stash_autocast(*args) returns the autocast settings; restored_autocast(state) is a context manager "
            "that runs its block under them")
AMP_CONTEXT = ("restored_autocast must be a context manager: decorate it with @contextmanager and yield once "
               "inside, while the stashed settings are in force")
AMP_DTYPE = ("stash the autocast dtype too (torch.get_autocast_dtype(device)) and pass it to torch.autocast: the "
             "forward may have run in float16 as well as bfloat16")
AMP_ENABLED = ("stash whether autocast was on for each device type (torch can tell, per device) and re-enter it with "
               "enabled=that: a forward that ran without autocast must be recomputed without it, even inside "
               "an autocast region")
AMP_NOT_SET = ("restored_autocast must enter torch.autocast again, with the stashed dtype and on/off setting, for "
               "each stashed device type; ops inside the block ran in float32")
AMP_CACHE = ("stash whether autocast's weight-cast cache was on (torch.is_autocast_cache_enabled(), the state's "
             "cache_enabled) and pass it back to torch.autocast: a forward that ran without the cache reruns "
             "without it")
AMP_CUDA = ("stash the settings of every device type among the inputs (a.device.type for each tensor), not only "
            "the CPU's, and re-enter torch.autocast for each")
AMP_LEAVE = ("enter torch.autocast as a context manager (an ExitStack holds several) so that leaving the block "
             "restores the settings that were there before")

# ---------------------------------------------------------------- Exercise 2.4: checkpoint
NON_TENSOR = ("non-tensor arguments and keyword arguments must reach fn unchanged in both runs: pass only the "
              "tensors through RecomputeRNG.apply and close over the rest in the function it reruns")
WARN = ("when grad mode is on and no tensor argument requires grad, warn: warnings.warn(\"None of the inputs "
        "have requires_grad=True. Gradients will be None ...\", stacklevel=2)")
WARN_GRAD_MODE = ("warn only when grad mode is on (torch.is_grad_enabled()): under torch.no_grad() nobody expects "
                  "gradients")
WARN_ANY = "warn only when no tensor argument requires grad (none of them does, not merely one)"
STACKLEVEL = "pass stacklevel=2 to warnings.warn, so the warning names the caller's line, not yours"
USE_RNG = ("with dropout inside fn, use RecomputeRNG.apply, not Recompute.apply: the recompute must replay "
           "the RNG")
BUILD_ON = ("build checkpoint on your RecomputeRNG (no autograd.Function of its own): it gets the tensor "
            "arguments and a function that reruns fn with the other arguments put back")
CLOSURE = ("run must use the tensors RecomputeRNG passes it (detached copies in backward), not the ones "
           "checkpoint was called with: a closure over args makes the rerun reach back into the layers before "
           "the checkpoint, and keeps the inputs alive as long as the graph")
AMP_REPLAY = ("stash_autocast(*tensors) in checkpoint and call fn under restored_autocast(state) inside run: "
              "the recompute in backward runs outside the forward's autocast region")
REFUSE_CKPT = ("checkpoint must refuse torch.autograd.grad() and write no .grad: build it on RecomputeRNG, whose "
               "backward calls refuse_unsupported_backward() before it reruns fn")
PREREQUISITE = "make Exercise {ex} pass first: {name} is built on it, and its checker fails ({got})"

# ---------------------------------------------------------------- Exercise 2.5: checkpoint_hooks
HOOKS_SPEC = ("unpack(i) must return the i-th tensor the rerun saved: rerun fn once on detached inputs with grad "
              "on, collecting what it saves in order")
HOOKS_FORWARD = ("checkpoint_hooks(fn, *args) runs fn(*args) under saved_tensors_hooks(pack, unpack) and returns "
                 "its output")
HOOKS_RNG = ("gradients differ only where dropout acts: stash the RNG state before running fn in forward and "
             "rerun it under restored_rng(state)")
HOOKS_RNG_AFTER = ("replay the RNG for the rerun only (restored_rng): afterwards the generator must continue where "
                   "training left it")
HOOKS_PACK = ("pack must return a placeholder (an index) and drop the tensor: the rerun in backward makes "
              "the tensor again")
HOOKS_GRAD_MODE = ("rerun fn under torch.enable_grad(): backward runs with grad mode off, and with it off fn saves "
                   "nothing for the unpacks to hand back")
HOOKS_ONCE = "rerun fn once, at the first unpack, and keep what it saves for the later unpacks"
HOOKS_GRAPH = ("keep the outer graph: run fn itself in forward, under saved_tensors_hooks (no autograd.Function), "
               "so autograd.grad sees fn's operations")
HOOKS_RELEASE = ("unpack must hand each tensor over and forget it (rebuilt.pop(index)): a tensor the checkpoint "
                 "still holds stays alive until the whole backward through fn is over")
HOOKS_INPUTS = ("keep fn's tensor inputs through autograd, with save_inputs(...), not in the closure: then a "
                "change made in place after forward raises instead of recomputing from the changed tensor, and "
                "saved-tensor hooks (the ledger) see the inputs")
HOOKS_PER_TASK = ("recompute once per backward: key what the rerun saved by torch._C._current_graph_task_id(), "
                  "so a second backward (retain_graph=True, or autograd.grad first) reruns fn for itself")
HOOKS_ARGS = ("non-tensor arguments and keyword arguments must reach fn unchanged in the rerun too: put each saved "
              "tensor back in its own place among the other arguments, and pass kwargs on")
HOOKS_FROZEN = ("when no input requires grad (a frozen layer's output), fn's parameters still need their gradients, "
                "which this design can give (the reentrant warning sends users here): keep the hooks and the rerun "
                "whatever the inputs require, each input rerun requiring grad only if it did")
HOOKS_AMP = ("stash_autocast(*args) in forward and rerun fn under restored_autocast(state): backward runs outside "
             "the forward's autocast region")

# what an autograd error message means, when it comes from a known mistake
FROM_SCRATCH = ("this exercise builds the checkpoint itself, from the Functions and hooks of this lab: an answer that "
                "calls torch.utils.checkpoint (or another library's checkpoint) does not build one")

KNOWN_ERRORS = (
    ("does not require grad and does not have a grad_fn", ENABLE_GRAD),
    ("incorrect number of gradients", N_GRADS),
    ("returned an invalid gradient at index", ORDER),
    ("backward through the graph a second time", DETACH),
    ("'NoneType' object has no attribute", NON_TENSOR_OUT),
    ("'int' object has no attribute", NON_TENSOR_OUT),
)
