"""The engine core: one thread that owns the model and runs continuous batching.

Requests join the running batch between decode steps: each is prefilled alone, then its KV cache
is left-padded and concatenated onto the batch's cache; finished sequences are dropped from the
batch and all-padding columns trimmed. Rows of different LoRA adapters and of the base model
decode together, in one forward (`batched_lora.py`). Control
operations (a full weight swap, loading or unloading an adapter) also run between steps, so a
swap never fails or blocks a request: tokens sampled after it carry the new version.

LoRA adapters sit over the base model (`adapters.py`: registered, resident, evicted past a
budget and loaded again on demand).

Reported logprobs are those of the model's raw distribution (log-softmax of the logits, before
temperature or top-p), as vLLM reports them by default; a teacher-forced forward pass of the
same tokens gives the same numbers.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.utils import logging as hf_logging

from claw_stream.engine.adapters import Adapters
from claw_stream.engine.prefix_cache import PrefixCache
from claw_stream.names import adapter_version

log = logging.getLogger(__name__)

PROMPT_LOGPROB_CHUNK = 512  # positions per lm_head chunk when scoring a prompt


@dataclass
class GenerationParams:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_strings: list[str] = field(default_factory=list)
    top_logprobs: int = 0
    prompt_logprobs: int | None = None  # None: not wanted; k: chosen token plus top k
    adapter: str | None = None


@dataclass
class TokenEvent:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    version: int
    text: str  # text this token completed (may be "" while a character is incomplete)


@dataclass
class FinishEvent:
    reason: str  # stop | length | abort
    stop_reason: int | str | None
    text: str  # the whole generated text, stop string excluded
    prompt_logprobs: list[list[tuple[int, float, int]] | None] | None = None
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens whose KV states came from the prefix cache


class Request:
    """One generation in flight; its events arrive on an asyncio queue of the caller's loop."""

    def __init__(self, params: GenerationParams, loop: asyncio.AbstractEventLoop):
        self.params = params
        self.loop = loop
        self.events: asyncio.Queue[TokenEvent | FinishEvent] = asyncio.Queue()
        self.cancelled = False

    def emit(self, event: TokenEvent | FinishEvent) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class _Seq:
    def __init__(self, request: Request, tokenizer: Any, stop_ids: set[int]):
        p = request.params
        self.request = request
        self.tokenizer = tokenizer
        self.stop_ids = stop_ids
        self.generated: list[int] = []
        self.n_cached = len(p.prompt_ids)
        self.next_token = -1
        self.generator: torch.Generator | None = None
        if p.seed is not None:
            self.generator = torch.Generator().manual_seed(p.seed)
        self._prefix = 0
        self._read = 0
        self.text = ""
        self.prompt_logprobs: list[list[tuple[int, float, int]] | None] | None = None
        self.cached_tokens = 0

    def _detokenize(self) -> str:
        """Incremental detokenisation: emit text only once its characters are complete."""
        decode = self.tokenizer.decode
        prefix = decode(self.generated[self._prefix : self._read], skip_special_tokens=True)
        full = decode(self.generated[self._prefix :], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.generated)
            return full[len(prefix) :]
        return ""

    def accept(
        self, token: int, logprob: float, top: list[tuple[int, float]], version: int, max_len: int
    ) -> FinishEvent | None:
        p = self.request.params
        self.generated.append(token)
        self.next_token = token
        delta = self._detokenize()
        finish: FinishEvent | None = None
        if token in self.stop_ids:
            finish = FinishEvent(
                "stop", None if token == self.tokenizer.eos_token_id else token, ""
            )
        else:
            before = len(self.text)
            self.text += delta
            for stop in p.stop_strings:
                at = self.text.find(stop, max(0, before - len(stop)))
                if at >= 0:
                    delta = delta[: max(0, at - before)]
                    self.text = self.text[:at]
                    finish = FinishEvent("stop", stop, "")
                    break
        if finish is None and (len(self.generated) >= p.max_tokens or self.n_cached + 1 >= max_len):
            finish = FinishEvent("length", None, "")
        self.request.emit(TokenEvent(token, logprob, top, version, delta))
        if finish is not None:
            finish.cached_tokens = self.cached_tokens
            if isinstance(finish.stop_reason, str):
                finish.text = self.text
            else:
                finish.text = self.tokenizer.decode(self.generated, skip_special_tokens=True)
        return finish


class _Batch:
    """The running sequences, of any adapters, with their padded KV cache."""

    def __init__(self) -> None:
        self.seqs: list[_Seq] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [B, T] 1 = real token

    def add(self, seq: _Seq, cache: DynamicCache) -> None:
        new_len = seq.n_cached
        new_mask = torch.ones(1, new_len, dtype=torch.long)
        if self.cache is None or self.mask is None:
            self.cache, self.mask, self.seqs = cache, new_mask, [seq]
            return
        total = max(self.mask.shape[1], new_len)
        pad_old, pad_new = total - self.mask.shape[1], total - new_len
        for old_layer, new_layer in zip(_kv_layers(self.cache), _kv_layers(cache), strict=True):
            old_layer.keys = torch.cat(
                [_left_pad(old_layer.keys, pad_old), _left_pad(new_layer.keys, pad_new)]
            )
            old_layer.values = torch.cat(
                [_left_pad(old_layer.values, pad_old), _left_pad(new_layer.values, pad_new)]
            )
        self.mask = torch.cat(
            [
                torch.nn.functional.pad(self.mask, (pad_old, 0)),
                torch.nn.functional.pad(new_mask, (pad_new, 0)),
            ]
        )
        self.seqs.append(seq)

    def keep(self, indices: list[int]) -> None:
        if not indices:
            self.seqs, self.cache, self.mask = [], None, None
            return
        assert self.cache is not None and self.mask is not None
        index = torch.tensor(indices)
        self.seqs = [self.seqs[i] for i in indices]
        self.mask = self.mask[index]
        drop = int(self.mask.shape[1] - max(s.n_cached for s in self.seqs))
        for layer in _kv_layers(self.cache):
            layer.keys = layer.keys[index, :, drop:]
            layer.values = layer.values[index, :, drop:]
        self.mask = self.mask[:, drop:]


def _kv_layers(cache: DynamicCache) -> list[Any]:
    """The cache's layers, each holding `keys` and `values` tensors [B, heads, T, dim] (a
    DynamicCache of a full-attention model; its type also admits linear-attention layers)."""
    return cast(list[Any], cache.layers)


def _left_pad(t: torch.Tensor, n: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, 0, n, 0)) if n else t


def _top(logprobs: torch.Tensor, k: int) -> list[tuple[int, float]]:
    if k <= 0:
        return []
    values, ids = torch.topk(logprobs, k)
    return list(zip(ids.tolist(), values.tolist(), strict=True))


def _sample(
    logits: torch.Tensor, params: GenerationParams, generator: torch.Generator | None
) -> int:
    if params.temperature == 0:
        return int(torch.argmax(logits))
    scaled = logits / params.temperature
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        cumulative = torch.softmax(sorted_logits, -1).cumsum(-1)
        cut = cumulative - torch.softmax(sorted_logits, -1) >= params.top_p
        sorted_logits[cut] = float("-inf")
        scaled = torch.full_like(scaled, float("-inf")).scatter(0, order, sorted_logits)
    probs = torch.softmax(scaled, -1)
    if generator is not None and generator.device != probs.device:
        # a seeded request's generator lives on the CPU: on a GPU, torch refused to sample
        # with it (every seeded request was a 500); sampled there, a seed gives the same
        # draws on any device
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator))


class EngineCore:
    def __init__(
        self,
        model_path: Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch: int = 32,
        max_model_len: int | None = None,
        threads: int | None = None,
        prefix_cache_mb: float = 0,
        prefix_block_tokens: int = 64,
        max_loaded_adapters: int | None = None,
    ):
        if threads:
            torch.set_num_threads(threads)
        hf_logging.disable_progress_bar()
        self.model_path = model_path
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype)
        # transformers types `.to` as its own decorator wrapper, which mypy cannot see through
        self.model = model.to(self.device)  # type: ignore[arg-type]
        self.model.eval()
        config = self.model.config
        self.max_model_len = max_model_len or int(getattr(config, "max_position_embeddings", 2048))
        self.stop_ids = self._stop_token_ids()
        self.max_batch = max_batch
        # The batch joins its sequences' caches, and the prefix cache cuts them into blocks, as if
        # every layer held every position: true of full-attention layers only. A sliding-window
        # layer keeps its window (Gemma 3: 512), and joining failed ("Expected size 511 but got
        # size 1297"): such a model serves one request at a time, without the prefix cache.
        full_attention = all(
            type(layer) is DynamicLayer for layer in _kv_layers(DynamicCache(config=config))
        )
        if not full_attention:
            log.warning(
                "sliding-window or linear attention layers: requests are served one at a time, "
                "without the prefix cache"
            )
            self.max_batch = 1
            prefix_cache_mb = 0
        self.version = 0
        self.lora = Adapters(self.model, max_loaded_adapters)
        self._incoming: queue.Queue[Request] = queue.Queue()
        self._control: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._wake = threading.Event()
        self._batch = _Batch()
        self._running = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.tokens_generated = 0
        self.prefix_cache: PrefixCache | None = None
        if prefix_cache_mb > 0:
            self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20), prefix_block_tokens)

    def _stop_token_ids(self) -> set[int]:
        ids: set[int] = set()
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        for value in eos if isinstance(eos, list) else [eos]:
            if value is not None:
                ids.add(int(value))
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        for token in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
            tid = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id and tid >= 0:
                ids.add(tid)
        return ids

    # -- public, thread-safe ---------------------------------------------------------------

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="engine-core", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._running = False
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=10)

    def submit(self, request: Request) -> None:
        self._incoming.put(request)
        self._wake.set()

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run fn on the engine thread between two decode steps."""
        future: Future[Any] = Future()
        self._control.put((fn, future))
        self._wake.set()
        return future

    def version_of(self, adapter: str | None) -> int:
        return self.version if adapter is None else self.adapters[adapter]

    def load_weights(
        self, state_dict: dict[str, torch.Tensor], version: int, *, rollback: bool = False
    ) -> None:
        """Engine thread: copy new weights in place (an adapter, if any, stays on top); with
        `rollback` the version label may go back."""
        if version <= self.version and not rollback:
            raise ValueError(
                f"version {version} is not newer than the served version {self.version}"
            )
        model_keys = set(self.model.state_dict())
        missing = [k for k in model_keys if k not in state_dict]
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        missing = [k for k in missing if not (tied and k.endswith("lm_head.weight"))]
        unknown = [k for k in state_dict if k not in model_keys]
        if missing or unknown:
            raise ValueError(
                f"weights do not fit the model: missing {missing[:5]}, unexpected {unknown[:5]}"
            )
        with torch.no_grad():
            self.model.load_state_dict(state_dict, strict=False)
            if tied:
                self.model.tie_weights()
        self.version = version
        if self.prefix_cache is not None:  # adapters sit on the base weights: all of it
            self.prefix_cache.drop(everything=True)

    @property
    def adapters(self) -> dict[str, int]:
        """Registered adapters (servable): name -> weight version."""
        return self.lora.versions

    def latest_policy_adapter(self, policy: str) -> str | None:
        """The newest `policy@vN` newer than the base weights, if any: what the trainer
        published last, so a client asking for the served model gets it (another policy's
        adapters, a tenant's, are never the served model)."""
        newest = self.lora.newest(policy)
        return newest if newest is not None and self.adapters[newest] > self.version else None

    def load_adapter(self, name: str, path: str) -> None:
        """Register adapter `name` and bring it into the model."""
        version = adapter_version(name)
        self.lora.register(name, path, self.version if version is None else version, self._busy())

    def unload_adapter(self, name: str) -> None:
        if name not in self.adapters:
            raise KeyError(name)
        batch, keep = self._batch, []
        for i, seq in enumerate(batch.seqs):  # its requests end now: finish_reason "abort"
            if seq.request.params.adapter == name:
                seq.request.emit(FinishEvent("abort", None, seq.text, error="adapter unloaded"))
            else:
                keep.append(i)
        if len(keep) != len(batch.seqs):
            batch.keep(keep)
        self.lora.drop(name)
        if self.prefix_cache is not None:
            self.prefix_cache.drop(name)

    def _busy(self) -> set[str]:
        """Adapters with requests running."""
        return {a for s in self._batch.seqs if (a := s.request.params.adapter) is not None}

    # -- engine thread --------------------------------------------------------------------------

    def _loop(self) -> None:
        with torch.inference_mode():
            while self._running:
                self._run_control()
                self._admit()
                batch = self._batch
                if not batch.seqs:
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                try:
                    self._decode(batch)
                except Exception as exc:  # never leave a client waiting forever
                    log.exception("decode step failed")
                    for seq in batch.seqs:
                        seq.request.emit(FinishEvent("abort", None, seq.text, error=str(exc)))
                    batch.keep([])

    def _run_control(self) -> None:
        while True:
            try:
                fn, future = self._control.get_nowait()
            except queue.Empty:
                return
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)

    def _admit(self) -> None:
        running = len(self._batch.seqs)
        while running < self.max_batch:
            try:
                request = self._incoming.get_nowait()
            except queue.Empty:
                return
            if request.cancelled:
                continue
            try:
                if self._prefill(request):
                    running += 1
            except Exception as exc:
                log.exception("prefill failed")
                request.emit(FinishEvent("abort", None, "", error=f"{type(exc).__name__}: {exc}"))

    def _hidden(self, **kwargs: Any) -> tuple[torch.Tensor, DynamicCache]:
        out = self.model.get_decoder()(use_cache=True, **kwargs)
        return out.last_hidden_state, out.past_key_values

    def _logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.model.get_output_embeddings()(hidden).float(), dim=-1)

    def _prefill(self, request: Request) -> bool:
        """Prefill one request; True when it joined the batch to keep generating."""
        p = request.params
        if p.adapter is not None and p.adapter not in self.adapters:
            request.emit(FinishEvent("abort", None, "", error=f"adapter {p.adapter} is not loaded"))
            return False
        if p.adapter is not None:
            self.lora.make_resident(p.adapter, self._busy())
        self.lora.use([p.adapter])
        version = self.version_of(p.adapter)
        ids = torch.tensor([p.prompt_ids], device=self.device)
        cache = DynamicCache(config=self.model.config)
        prefix = self.prefix_cache if p.prompt_logprobs is None else None  # needs every position
        cached = 0
        if prefix is not None:
            cached, layers = prefix.lookup(
                (p.adapter, version), p.prompt_ids, len(p.prompt_ids) - 1
            )
            for i, (keys, values) in enumerate(layers):
                cache.update(keys, values, i)
        hidden, cache = self._hidden(input_ids=ids[:, cached:], past_key_values=cache)
        if prefix is not None:
            kv = _kv_layers(cache)
            prefix.store(
                (p.adapter, version), p.prompt_ids, [(layer.keys, layer.values) for layer in kv]
            )
        prompt_logprobs = (
            self._prompt_logprobs(hidden[0], p) if p.prompt_logprobs is not None else None
        )
        seq = _Seq(request, self.tokenizer, self.stop_ids)
        seq.cached_tokens = cached
        if p.max_tokens == 0:
            request.emit(
                FinishEvent(
                    "length", None, "", prompt_logprobs=prompt_logprobs, cached_tokens=cached
                )
            )
            return False
        logprobs = self._logprobs(hidden[0, -1])
        finish = self._choose(seq, logprobs, version)
        if finish is not None:
            finish.prompt_logprobs = prompt_logprobs
            request.emit(finish)
            return False
        seq.prompt_logprobs = prompt_logprobs
        self._batch.add(seq, cache)
        return True

    def _prompt_logprobs(
        self, hidden: torch.Tensor, p: GenerationParams
    ) -> list[list[tuple[int, float, int]] | None]:
        """Per prompt position: the actual token's logprob and rank, then the top-k others."""
        ids = torch.tensor(p.prompt_ids[1:], device=hidden.device)
        out: list[list[tuple[int, float, int]] | None] = [None]
        k = p.prompt_logprobs or 0
        for start in range(0, len(ids), PROMPT_LOGPROB_CHUNK):
            chunk = self._logprobs(hidden[start : start + PROMPT_LOGPROB_CHUNK][: len(ids) - start])
            targets = ids[start : start + len(chunk)]
            chosen = chunk.gather(1, targets[:, None])[:, 0]
            ranks = (chunk > chosen[:, None]).sum(1) + 1
            tops = torch.topk(chunk, k) if k else None
            for i in range(len(targets)):
                entry = [(int(targets[i]), float(chosen[i]), int(ranks[i]))]
                if tops is not None:
                    for rank, (tid, lp) in enumerate(
                        zip(tops.indices[i].tolist(), tops.values[i].tolist(), strict=True), 1
                    ):
                        if tid != entry[0][0]:
                            entry.append((tid, lp, rank))
                out.append(entry)
        return out

    def _choose(self, seq: _Seq, logprobs: torch.Tensor, version: int) -> FinishEvent | None:
        p = seq.request.params
        token = _sample(logprobs, p, seq.generator)
        self.tokens_generated += 1
        return seq.accept(
            token,
            float(logprobs[token]),
            _top(logprobs, p.top_logprobs),
            version,
            self.max_model_len,
        )

    def _decode(self, batch: _Batch) -> None:
        assert batch.cache is not None and batch.mask is not None
        seqs = batch.seqs
        adapters = [s.request.params.adapter for s in seqs]
        self.lora.use(adapters)
        versions = {a: self.version_of(a) for a in set(adapters)}
        past = batch.mask.shape[1]
        mask = torch.cat([batch.mask, torch.ones(len(seqs), 1, dtype=torch.long)], dim=1)
        hidden, batch.cache = self._hidden(
            input_ids=torch.tensor([[s.next_token] for s in seqs], device=self.device),
            attention_mask=mask.to(self.device),
            position_ids=torch.tensor([[s.n_cached] for s in seqs], device=self.device),
            cache_position=torch.tensor([past], device=self.device),
            past_key_values=batch.cache,
        )
        batch.mask = mask
        logprobs = self._logprobs(hidden[:, -1])
        self.steps += 1
        keep = []
        for i, seq in enumerate(seqs):
            seq.n_cached += 1
            if seq.request.cancelled:
                seq.request.emit(FinishEvent("abort", None, seq.text))
                continue
            finish = self._choose(seq, logprobs[i], versions[adapters[i]])
            if finish is None:
                keep.append(i)
            else:
                finish.prompt_logprobs = seq.prompt_logprobs
                seq.request.emit(finish)
        if len(keep) != len(seqs):
            batch.keep(keep)
