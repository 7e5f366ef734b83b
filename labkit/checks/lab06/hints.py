"""Lab 06's hints: one per mistake, each used from here (tests hold them distinct)."""
from __future__ import annotations

# ---------------------------------------------------------------- Exercise 6.1: difference
DIFF_SPEC = "difference(name, a, b) returns a Difference(name, bitwise, max_abs, max_rel, detail) for the pair"
DIFF_EQUAL = ("tensors whose bits all agree are bitwise equal, and no error is left to measure: decide that before "
              "taking the largest error over the elements that differ (a max over no elements raises)")
DIFF_BITS = ("bitwise means the same bits: == and torch.equal call -0.0 equal to 0.0 and a NaN unequal to itself; "
             "compare the tensors viewed as integers of their element size (t.view(torch.int32) for float32)")
DIFF_TOLERANCE = ("a tolerance (allclose, isclose) is not bitwise: a difference of one unit in the last place must "
                  "show, with its size in max_abs and max_rel")
DIFF_META = ("tensors of another shape, dtype or device are not comparable element by element (broadcasting "
             "would hide a shape change): bitwise False, max_abs and max_rel inf, and detail saying which differs")
DIFF_DTYPE = ("the same element size is not the same dtype: a float32 tensor and its view as int32 hold the same "
              "bits and mean other numbers; compare a.dtype with b.dtype")
DIFF_DEVICE = ("tensors on two devices (the CPU and a GPU, or the meta device, which holds no data) are not "
               "comparable: compare a.device with b.device before you look at a value")
DIFF_MISSING = ("None is a missing tensor (a gradient that never came): two Nones are equal; one None is not "
                "comparable (inf, with a detail)")
DIFF_ABS = ("max_abs is the largest |a - b| over the elements whose bits differ (an inf against the same inf "
            "is no error, though inf - inf is NaN)")
DIFF_WIDE = ("compute the errors in float64, not in the tensors' own dtype: there |a - b| overflows or rounds "
             "(float16's 65504 against -65504 is 131008 apart, which float16 holds only as inf)")
DIFF_NAN = ("a NaN against a number is an error, and |1.0 - NaN| is NaN: max_abs must say NaN, not 0 (an error of 0 "
            "lets within() accept a NaN gradient); only a NaN against the same NaN bits is no error")
DIFF_ZERO = ("0.0 against -0.0: the bits differ, the values do not, so max_abs is 0; over a baseline of zeros "
             "max_rel is then 0 (both are 0), not inf")
DIFF_REL = ("max_rel is max_abs over the largest |a| of the baseline a (not the largest per-element ratio); when "
            "that is 0 it is 0 for equal values and inf otherwise")
DIFF_INPUTS = "leave a and b as they were (detach before you compute; do not change them in place)"

# ---------------------------------------------------------------- Exercise 6.2: batchnorm_once
BN_SPEC = "batchnorm_once(model) patches every BatchNorm of model in place and returns model"
BN_TWICE = ("under recomputation the running statistics still change twice: while in_backward() (the rerun), give "
            "each BatchNorm momentum 0.0 and no num_batches_tracked (None), so the rerun moves nothing")
BN_RERUN = ("the rerun must save what the forward saved: switching track_running_stats off makes BatchNorm save "
            "other tensors, and PyTorch's checkpoint refuses (different metadata); keep the running statistics "
            "in the call and make the update a no-op instead")
BN_EVAL = ("eval() in the rerun makes BatchNorm normalise by its running statistics instead of the batch's: "
           "the rerun computes other activations than the forward did (PyTorch's checkpoint refuses, or the "
           "gradients are wrong); keep it in training mode and make the update a no-op instead")
BN_RAISED = ("a checkpointed step must run: the rerun computes what the forward computed, saving tensors of the "
             "same shapes and dtypes (PyTorch's checkpoint compares them)")
BN_DETECT = ("right under the reentrant checkpoint, twice under the non-reentrant one: its forward runs with grad "
             "enabled, so torch.is_grad_enabled() cannot tell a forward from a rerun; in_backward() can")
BN_ALWAYS = ("a plain training step (no checkpoint) must still update the statistics once: freeze them only while "
             "in_backward()")
BN_RESTORE = ("after a rerun, put momentum and num_batches_tracked back, also when the rerun stops early (PyTorch's "
              "non-reentrant checkpoint stops once backward has what it needs, before a BatchNorm that ends its block "
              "reaches its forward hook): when the step ends, the statistics must be as after a plain step")
BN_NONE = ("a BatchNorm with momentum=None (a cumulative average) must get None back after the rerun: None is its "
           "momentum, not 'nothing stashed'; left at 0.0 it never updates again")
BN_SHARED = ("one BatchNorm module can run in two checkpointed blocks: a rerun that finds it still frozen by an "
             "earlier rerun of the same backward (stopped early) must not stash the frozen 0.0 and None as its "
             "momentum and count")
BN_ALL = ("patch every kind of BatchNorm (1d, 2d, 3d, SyncBatchNorm): they share the base class "
          "nn.modules.batchnorm._BatchNorm")
BN_MOMENTUM = ("an adjusted momentum makes two updates come close to one, not equal, and counts "
               "num_batches_tracked twice; freeze the statistics during the rerun instead, which is exact")
BN_OUTPUT = "the patch must not change outputs or gradients: in the rerun BatchNorm still normalises by the batch"

# ---------------------------------------------------------------- Exercise 6.3: recommend
REC_SPEC = "recommend(s) returns a scheme's name from s.schemes (a str), or None when no scheme fits"
REC_INFERENCE = "a step that does not train (s.training is False) saves nothing for backward: recommend \"none\""
REC_FITS = "when the plain step's peak is within the budget, checkpointing only costs time: recommend \"none\""
REC_EQUAL = "a peak equal to the budget fits (peak <= budget), the plain step's as any scheme's"
REC_LEAST = "of the schemes that fit, take the one with the least predicted overhead"
REC_FIT_ONLY = "a scheme whose peak (peak_bytes) is over the budget is no candidate, however cheap"
REC_MEASURED = ("a scheme fits by its measured peak (peak_bytes), not by predicted_bytes: the prediction misses what "
                "a checkpoint holds beyond the per-block sums, and the decision must hold when the step runs")
REC_NONE = ("when no scheme fits, return None: keeping everything (\"none\") does not fit either, and checkpointing "
            "cannot remove parameters, gradients or optimizer state")
REC_TIE = ("between schemes of equal overhead, take the one with the lower peak (peak_bytes), wherever it stands in "
           "s.schemes and whatever its name")
