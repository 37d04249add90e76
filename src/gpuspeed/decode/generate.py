"""Generation as users expect it: greedy or temperature / top-k / top-p sampling on the device from a seeded
generator, and EOS stops checked every N steps (never a per-token host sync).

`generate(engine, prompt, new_tokens)` runs one variant's prefill then its decode loop and returns the
tokens on the host; `Sampling` says how the next token is chosen.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from gpuspeed.errors import UserError


@dataclass(frozen=True)
class Sampling:
    """Greedy (temperature 0) or sampling; the generator is seeded once per generation."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def __post_init__(self):
        # a float top-k or seed, a string temperature: each rung failed in torch mid-run (topk, manual_seed)
        for key, kind in (("temperature", "real"), ("top_k", "int"), ("top_p", "real"), ("seed", "int")):
            value = getattr(self, key)
            if value is None and key in ("top_k", "top_p"):
                continue
            ok = not isinstance(value, bool) and isinstance(value, numbers.Integral if kind == "int" else numbers.Real)
            if not ok:
                raise UserError(f"sampling {key} must be {'an integer' if kind == 'int' else 'a number'}, got "
                                f"{type(value).__name__} {value!r}")
            object.__setattr__(self, key, int(value) if kind == "int" else float(value))
        if not (self.temperature == 0 or 1e-4 <= self.temperature < float("inf")):  # NaN too
            # a tinier temperature overflows logits / T to inf (NaN probabilities): 0 is greedy
            raise UserError(f"temperature must be 0 (greedy) or between 1e-4 and a finite number, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise UserError(f"top-k must be >= 1, or 0 for none, got {self.top_k}")
        if self.top_k == 0:  # no top-k, as transformers' top_k=0 and llama.cpp's --top-k 0
            object.__setattr__(self, "top_k", None)
        if self.top_p is not None and not (0 < self.top_p <= 1):
            raise UserError(f"top-p must be in (0, 1], got {self.top_p}")

    @classmethod
    def from_fields(cls, fields: dict) -> Sampling:
        """A Sampling from a dict of its fields, as a results file's params.sampling holds it."""
        try:
            return cls(**fields)
        except TypeError as exc:
            raise UserError(f"sampling {fields!r}: {exc}; its keys are temperature, top_k, top_p, seed") from None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_options(cls, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                     seed: int = 0) -> tuple[Sampling, str | None]:
        """The command line's sampling: (Sampling, a note or None). Greedy (temperature 0) beside --top-k 1, --top-k 0
        (none) or --top-p 1 (every token), settings that leave greedy's choice as it is, runs greedy and says so in
        the note; any other --top-k or --top-p beside it is refused: greedy would ignore it, the user meant to sample."""
        s = cls(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)  # the ranges first
        given = ([f"--top-k {top_k}"] if top_k is not None else []) + ([f"--top-p {top_p:g}"] if top_p is not None else [])
        if not s.greedy or not given:
            return s, None
        shaping = ([f"--top-k {top_k}"] if top_k not in (None, 0, 1) else []) + \
                  ([f"--top-p {top_p:g}"] if top_p not in (None, 1) else [])
        if shaping:
            raise UserError(f"{' and '.join(shaping)} shape{'s' if len(shaping) == 1 else ''} sampling: give "
                            "--temperature > 0 too (0 is greedy; --top-k 1 and --top-p 1 are greedy's own)")
        return cls(seed=seed), (f"temperature 0 is greedy: {' and '.join(given)} leave{'s' if len(given) == 1 else ''} "
                                "its choice as it is, so the run is greedy")

    def generator(self, device) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(self.seed)


GREEDY = Sampling()


def sample(logits: torch.Tensor, s: Sampling, gen: torch.Generator | None) -> torch.Tensor:
    """Next tokens [B] from logits [B, V], on the device with no host sync.

    Sampling draws by the exponential race (argmax of p / E, E ~ Exp(1)), which picks index i with
    probability p_i and needs neither multinomial's host-side checks nor a sync."""
    if s.greedy or s.top_k == 1:  # top-k 1 is greedy: a tie at the top goes to the lowest index, as argmax's
        return logits.argmax(-1)
    x = logits.float() / s.temperature
    if s.top_k is not None and s.top_k < x.shape[-1]:
        # transformers' TopKLogitsWarper: every token tied with the k-th is kept
        kth = torch.topk(x, s.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if s.top_p is not None and s.top_p < 1:
        # the smallest prefix (most likely first, ties by index) whose mass reaches top_p: a token goes when the
        # mass before it already reaches top_p (transformers' TopPLogitsWarper: the tail with mass <= 1 - top_p)
        srt, idx = torch.sort(x, dim=-1, descending=True, stable=True)
        cum = srt.softmax(-1).cumsum(-1)
        drop = torch.cat([torch.zeros_like(cum[..., :1], dtype=torch.bool), cum[..., :-1] >= s.top_p], dim=-1)
        x = x.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))
    p = x.softmax(-1)
    race = torch.empty_like(p).exponential_(1.0, generator=gen)
    return (p / race).argmax(-1)


def eos_tensor(eos_ids, device) -> torch.Tensor | None:
    # one id, as a tokenizer's eos_token_id is: "'int' object is not iterable"
    ids = [int(eos_ids)] if isinstance(eos_ids, numbers.Integral) else [int(e) for e in (eos_ids or [])]
    return torch.tensor(ids, device=device, dtype=torch.long) if ids else None


def mark_done(nxt: torch.Tensor, done: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """After a sequence has emitted EOS, it keeps emitting EOS; `done` is updated in place."""
    nxt = torch.where(done, eos[0], nxt)
    done |= (nxt[:, None] == eos[None, :]).any(-1)  # not torch.isin: its sort path could not be captured
    return nxt


def check_prompt(prompt, model) -> None:
    """A one-line UserError for a prompt that is not the model's token ids: a float tensor failed in torch's embedding,
    an id past the vocab (or negative) with an IndexError on the CPU and a device-side assert (a dead context) on a GPU."""
    a = model.args if getattr(model, "tp", None) is None else model.tp.args  # a TP shard: the whole model's vocab
    if not isinstance(prompt, torch.Tensor) or prompt.dtype.is_floating_point or prompt.dtype.is_complex \
            or prompt.dtype == torch.bool:
        what = f"a {prompt.dtype} tensor" if isinstance(prompt, torch.Tensor) else f"a {type(prompt).__name__}"
        raise UserError(f"the prompt must be token ids (an integer tensor [batch, length]), got {what}")
    if prompt.dim() == 2 and prompt.shape[1] == 0:  # the prefill's last position was an IndexError
        raise UserError("the prompt holds no tokens: give at least one (a BOS)")
    if prompt.numel():
        lo, hi = int(prompt.min()), int(prompt.max())  # one host read a generation, before any kernel indexes with them
        if lo < 0 or hi >= a.vocab_size:
            raise UserError(f"the prompt holds token id {lo if lo < 0 else hi}, outside the model's vocab of "
                            f"{a.vocab_size} (0..{a.vocab_size - 1})")


def generate(engine, prompt: torch.Tensor, new_tokens: int, *, on_logits=None) -> torch.Tensor:
    """prefill + decode with one engine (a variant built for this model); tokens [B, <= new_tokens] on the host.

    With EOS ids set on the engine, generation stops once every sequence is done (checked every
    engine.check_every steps) and tokens after a sequence's EOS are EOS."""
    # a float or a string failed in torch (range, '<'), and True generated one token as 1
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, numbers.Integral) or new_tokens < 1:
        raise UserError(f"the number of new tokens must be an integer >= 1, got {type(new_tokens).__name__} "
                        f"{new_tokens!r}")
    new_tokens = int(new_tokens)
    check_prompt(prompt, engine.model)
    if prompt.dtype not in (torch.int64, torch.int32):  # the embedding takes no other (a uint8 prompt failed there)
        prompt = prompt.long()
    first = engine.prefill(prompt, on_logits=on_logits)
    if new_tokens == 1:
        return first[:, None].cpu()
    rest = engine.decode(first, new_tokens - 1, on_logits=on_logits)
    return torch.cat([first[:, None].cpu(), rest], dim=1)


def worst(values) -> float | None:
    """The largest of these errors, NaN where any is NaN (or None: a NaN as a results file holds it, null); None
    for none. Python's max keeps whichever it saw first when a NaN is compared: a NaN after a finite value was
    dropped (a rung whose last steps' logits were NaN reported the error of its first)."""
    vals = list(values)
    if not vals:
        return None
    if any(v is None or v != v for v in vals):
        return float("nan")
    return max(vals)


def logit_error(logits: list, ref_logits: list) -> tuple[float, float]:
    """Over paired steps' logits: the max |logit - reference logit| and that over the max |reference logit|
    (NaN where any step's is)."""
    err = worst(float((a.detach().float().cpu() - r.detach().float().cpu()).abs().max())
                for a, r in zip(logits, ref_logits, strict=True))
    scale = worst(float(r.detach().float().abs().max()) for r in ref_logits)
    return err, err / max(scale, 1e-30) if scale == scale else float("nan")
