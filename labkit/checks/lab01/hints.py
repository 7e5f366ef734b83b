"""Lab 01's hints: one per mistake, each used from here (tests hold them distinct)."""
from __future__ import annotations

INT = 'return a Python int: use // rather than /, or int(...) / .item() on the result'
CHAIN_SHARED = "ReLU's output is the next Linear's input: one storage, count it once"
CHAIN_INPUT = "the first Linear saves the chain's input x too: count it"
CHAIN_DTYPE = ('use the element size of dtype, not 4 bytes: bfloat16 and float64 differ (a dtype has .itemsize, '
               'a tensor of that dtype .element_size())')
CHAIN_ELEMENTS = 'bytes, not elements: multiply by the element size of dtype'
CHAIN_PARAMS = 'weights and biases are parameters, not saved activations: leave them out'
CHAIN_DEFAULT = 'each Linear saves its input and each ReLU its output; they share storages, so count each once'
BLOCK_ELEMENTS = 'bytes, not elements: multiply by the element size of cfg.dtype'
MASK_BOOL = 'a dropout mask is bool: one byte per element, whatever the activation dtype'
MASK_SAVED = 'dropout saves its mask for backward (which elements it kept)'
MLP_WIDE = "the MLP is 4h wide in the middle (fc1: h → 4h): what GeLU and fc2 keep is that wide, not h wide"
CORE_V = "the ·v matmul saves v too (to get the scores' gradient)"
CORE_QK = "q·kᵀ saves both q and k (each is needed for the other's gradient)"
CORE_MASK = 'dropout saves its mask: one byte per (b, a, s, s) element'
CORE_DROP_OUT = ('the ·v matmul saves its other operand too, the dropout output: a second (b, a, s, s) tensor in the '
                 'activation dtype')
CORE_HEADS = 'each head has its own s × s scores: multiply by a'
CORE_SCORES = ('core attention keeps (b, a, s, s) tensors too, not only q, k and v: go through softmax, its '
               'dropout and the ·v matmul with the rules above and ask what each keeps')
SAVES_INPUT = 'every Linear and LayerNorm saves its input'
LN_STATS = "leave out LayerNorm's per-row mean and rstd, as the spec says"
BLOCK_DICT = 'return a dict keyed by module name, as the spec shows'
BLOCK_KEYS = 'one key per module the spec lists; attn.core includes its dropout (attn.core.drop)'
BLOCK_INTS = 'return Python ints: use // rather than /, or int(...) on the result'
FROZEN = 'frozen parameters (requires_grad=False) get no gradient and no Adam state: leave them out'
ADAM_TWO = "Adam keeps two buffers per parameter (exp_avg, exp_avg_sq), each the parameter's size"
FOUR_TENSORS = 'four tensors per parameter: the parameter, its gradient, exp_avg and exp_avg_sq'
STEP_COUNTERS = "leave out Adam's scalar step counters, as the exercise says"
TIED = 'a shared parameter is one tensor: count it once (model.parameters() lists it once)'
PARAM_DTYPE = "use each parameter's element size (p.element_size()), not 4 bytes"
PARAM_ELEMENTS = 'bytes, not elements: multiply by p.element_size()'
STATE_DEFAULT = ('run one real Adam step on a small model and count, per trainable parameter, every tensor it '
                 'leaves (the parameter, p.grad, what opt.state[p] holds, step counters aside), in bytes of its dtype')
SMALLEST_ONE = 'the smallest batch is 1'
ROUND_UP = 'round up: a batch whose activations fall short of the state has not crossed it'
GREATER_EQUAL = 'b · per_sample_bytes == state_bytes already counts (>=): the smallest such b'
FLOAT_DIVISION = ("stay in integers: state_bytes / per_sample_bytes is a float, which past 2**53 no longer holds "
                  "every integer, so its ceiling can be one off; round up with // alone")
CROSS_DEFAULT = ('work (7, 7), (300, 1000) and (64, 0) out by hand from the spec (the smallest b >= 1 with '
                 'b * per_sample_bytes >= state_bytes) and hold your function against them, in integers')
HOOK_RETURN = ("pack must return something your unpack turns back into the tensor (the tensor's data, without its "
               'history): backward unpacks what pack returned')
HOOK_CALL = 'call fn(*args) inside the saved-tensors hooks context (torch.autograd.graph), given your pack and unpack'
HOOK_CYCLE = ('pack must not hand back t itself, only its data without its history: a node that keeps the very '
              'tensor whose grad_fn it is makes a '
              "reference cycle through C++ that Python's collector cannot free, so every graph you measure would "
              'stay in memory')
HOOK_DEDUPE = 'count each storage once: remember t.untyped_storage().data_ptr() of what you counted'
HOOK_PARAMS = 'leave out nn.Parameters and their views: a Linear saves weight.t(), whose _base is the weight'
HOOK_STORAGE = 'a saved view keeps its whole storage alive: count t.untyped_storage().nbytes()'
HOOK_NOT_INSTALLED = ('register pack and unpack as the saved-tensors hooks of torch.autograd.graph (a context '
                      'manager) and call fn(*args) inside it')
HOOK_DEFAULT = ('print what pack receives on a small case (shape, whether it or its _base is a Parameter, its '
                "storage's data_ptr() and nbytes()) and hold each against the exercise's rules: what to skip, what "
                'to count, how often')
RUN_ALONE = 'run {call} in a cell of its own to see where it fails'
BLOCK_DEFAULT = ('list what each op in {module} saves (the rules above) and count each storage once, in the module '
                 'that saves it first')
HOOK_LEAVES = ("leave out nn.Parameters only: an input that requires grad is a leaf too, but it is an activation the "
               "graph keeps for backward, so count it")
