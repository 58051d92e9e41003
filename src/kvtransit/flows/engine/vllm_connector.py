"""kvtransit's KV connector for vLLM (the v1 `KVConnectorBase_V1` API): a prefill instance's KV through the middlebox.

Imported only inside a vLLM process (it imports vllm and torch), named in vLLM's `--kv-transfer-config` by
`"kv_connector": "KvtransitConnector", "kv_connector_module_path": "kvtransit.flows.engine.vllm_connector"`, the
way vLLM loads a connector that lives outside its tree (vllm/distributed/kv_transfer/kv_connector/factory.py). The
settings ride in `kv_connector_extra_config` (flows/engine/instances.py writes them):

    kv_producer (the prefill instance):  {"middlebox": "HOST:PORT", "record": PATH}
    kv_consumer (the decode instance):   {"listen": "HOST:PORT", "record": PATH}

and a request takes part when its body's `kv_transfer_params` hold `{"kvtransit_id": N}` (the wire's request id;
on decode, optionally `"kvtransit_tokens": T`, the KV's tokens when the prompt carries more than the hand-off, as a
teacher-forced continuation does).

vLLM splits a connector in two (the factory builds each role in its own process):

- **Scheduler side** (the engine core). Producer: follows each taking-part request's blocks as the scheduler
  hands them out, and names it in the step whose forward computes its last prompt token. Consumer:
  `get_num_new_matched_tokens` says the prompt's KV will be loaded *asynchronously* (the request waits in
  WAITING_FOR_REMOTE_KVS, its blocks allocated, while other requests run), and the next step's metadata tells the
  worker into which blocks.
- **Worker side** (the model runner). Producer: `wait_for_save`, after the forward, copies the named requests'
  K and V out of the paged cache and hands them to the link (kv_link.KvSender), stamped with that moment, the
  first token's. Consumer: each step it loads every pending request whose KV has arrived (kv_link.KvReceiver) into
  its blocks and reports it finished; one whose KV failed (corrupted, refused, lost) is reported finished *with its
  blocks invalid*, so vLLM fails the request (`kv_load_failure_policy` "fail", the default) and nothing of it
  reaches the cache.

The paged cache it reads and writes is vLLM's CPU attention backend's (paged_layout.py); any other layout is refused
when the caches are registered, with its shape, rather than read wrongly.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from kvtransit.flows.engine.kv_link import Geometry, KvReceiver, KvSender, now_ns
from kvtransit.flows.engine.paged_layout import gather_request_kv, scatter_request_kv
from kvtransit.flows.engine.vllm_extra import SUPPORTED_VLLM, check_vllm_version

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

PARAM_ID = "kvtransit_id"
PARAM_TOKENS = "kvtransit_tokens"
# A consumer engine with nothing to run but requests waiting for their KV steps in a loop; each such step waits
# this long for an arrival instead of returning at once, so the wait does not spin a core the middlebox needs
# (2 cores here). A step with work to do never waits.
IDLE_WAIT_S = 0.002
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


@dataclass(frozen=True)
class SendSpec:
    request_id: str
    wire_id: int
    block_ids: list[int]
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class LoadSpec:
    request_id: str
    wire_id: int
    block_ids: list[int]
    start: int  # the first token the load writes (what the engine computed itself comes before)
    tokens: int  # the KV's tokens: the load writes [start, tokens)


@dataclass
class KvtransitMetadata(KVConnectorMetadata):
    sends: list[SendSpec] = field(default_factory=list)
    loads: list[LoadSpec] = field(default_factory=list)
    idle: bool = False  # the step schedules no tokens: the worker may wait a little for an arrival


def _wire_id(request: Request) -> int | None:
    params = request.kv_transfer_params or {}
    value = params.get(PARAM_ID)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**64:
        raise ValueError(f"kv_transfer_params.{PARAM_ID} must be an integer in 1..2^64-1, got {value!r}")
    return value


class KvtransitConnector(KVConnectorBase_V1):
    """The connector (module docstring); one object per role and process."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        check_vllm_version(vllm.__version__)
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        config = self._kv_transfer_config
        if config.kv_role not in ("kv_producer", "kv_consumer"):
            raise ValueError(f"KvtransitConnector: kv_role {config.kv_role!r}; an instance is a prefill "
                             f"(kv_producer) or a decode (kv_consumer), not both")
        self._producer = config.kv_role == "kv_producer"
        self._extra: dict[str, Any] = dict(config.kv_connector_extra_config)
        self._block_size = vllm_config.cache_config.block_size
        self._name = f"vllm-{'prefill' if self._producer else 'decode'}"
        # scheduler side
        self._taking_part: dict[str, tuple[int, int, int]] = {}  # producer: wire id, prompt, max tokens
        self._following: dict[str, SendSpec] = {}  # producer: requests whose prompt is still being computed
        self._computed: dict[str, int] = {}
        self._loads: list[LoadSpec] = []  # consumer: loads the next step's metadata carries
        self._loading: set[str] = set()  # consumer: requests whose KV was asked for (never asked twice)
        # worker side
        self._caches: list[torch.Tensor] = []
        self._pending: dict[str, LoadSpec] = {}
        self._finished_recving: set[str] = set()
        self._invalid_blocks: set[int] = set()
        self._sender: KvSender | None = None
        self._receiver: KvReceiver | None = None
        log.info("KvtransitConnector (%s, %s) for vLLM %s", role.name.lower(), config.kv_role, vllm.__version__)

    # ================================================================ scheduler side

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if self._producer or request.request_id in self._loading:
            return 0, False
        wire_id = _wire_id(request)
        if wire_id is None:
            return 0, False
        tokens = self._kv_tokens(request)
        count = tokens - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def _kv_tokens(self, request: Request) -> int:
        prompt = len(request.prompt_token_ids or [])
        given = (request.kv_transfer_params or {}).get(PARAM_TOKENS, prompt)
        if isinstance(given, bool) or not isinstance(given, int) or not 0 < given <= prompt:
            raise ValueError(f"kv_transfer_params.{PARAM_TOKENS} must be an integer in 1..{prompt} (the prompt's "
                             f"tokens), got {given!r}")
        return given

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        if self._producer:
            # Called as each waiting request is given its blocks: note those that hand their KV off.
            wire_id = _wire_id(request)
            if wire_id is not None:
                self._taking_part[request.request_id] = (wire_id, len(request.prompt_token_ids or []),
                                                         int(request.max_tokens))
            return
        if num_external_tokens <= 0:
            return
        wire_id = _wire_id(request)
        assert wire_id is not None  # get_num_new_matched_tokens asked for a load only for such a request
        tokens = self._kv_tokens(request)
        self._loading.add(request.request_id)
        self._loads.append(LoadSpec(request.request_id, wire_id, list(blocks.get_block_ids()[0]),
                                    tokens - num_external_tokens, tokens))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = KvtransitMetadata(idle=scheduler_output.total_num_scheduled_tokens == 0)
        meta.loads, self._loads = self._loads, []
        if not self._producer:
            return meta
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            taking_part = self._taking_part.pop(new.req_id, None)
            if taking_part is None:
                continue
            wire_id, prompt, max_tokens = taking_part
            self._following[new.req_id] = SendSpec(new.req_id, wire_id, list(new.block_ids[0]), prompt, max_tokens)
            self._computed[new.req_id] = new.num_computed_tokens + scheduled.get(new.req_id, 0)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            spec = self._following.get(req_id)
            if spec is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                spec.block_ids.extend(new_ids[0])
            self._computed[req_id] = cached.num_computed_tokens[i] + scheduled.get(req_id, 0)
        for req_id in [r for r, spec in self._following.items() if self._computed[r] >= spec.prompt_tokens]:
            meta.sends.append(self._following.pop(req_id))
            del self._computed[req_id]
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._taking_part.pop(request.request_id, None)
        self._following.pop(request.request_id, None)
        self._computed.pop(request.request_id, None)
        self._loading.discard(request.request_id)
        return False, None  # the KV was copied out in the step that computed it: the blocks may go now

    # ================================================================ worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = sorted(kv_caches, key=_layer_index)
        caches = [kv_caches[n] for n in names]
        first = caches[0]
        if first.dim() != 4 or first.shape[3] % 2 or first.shape[2] != self._block_size:
            raise ValueError(f"KvtransitConnector reads vLLM's CPU attention layout [blocks, kv_heads, "
                             f"block_size={self._block_size}, 2*head_dim]; layer {names[0]} is {list(first.shape)}")
        self._caches = caches
        geometry = Geometry(layers=len(caches), kv_heads=int(first.shape[1]), head_dim=int(first.shape[3]) // 2)
        host, port = _address(self._extra, "middlebox" if self._producer else "listen")
        if self._producer:
            self._sender = KvSender(host, port, name=self._name, record_path=self._extra.get("record"))
        else:
            self._receiver = KvReceiver(host, port, geometry, name=self._name, record_path=self._extra.get("record"))
        log.info("KvtransitConnector: %d layers, %d kv heads, head_dim %d, block %d, %s %s:%d", geometry.layers,
                 geometry.kv_heads, geometry.head_dim, self._block_size,
                 "sending to the middlebox at" if self._producer else "KV ingress on", host, port)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtransitMetadata)
        for load in meta.loads:
            self._pending[load.request_id] = load
        self._load_arrived()

    def _load_arrived(self) -> None:
        receiver = self._receiver
        if receiver is None:
            return
        for req_id, load in list(self._pending.items()):
            arrived = receiver.take(load.wire_id)
            if arrived is None:
                continue
            del self._pending[req_id]
            self._finished_recving.add(req_id)
            failure = arrived.failure
            if failure is None and arrived.tokens < load.tokens:
                failure = f"{arrived.tokens} tokens of KV arrived, the request needs {load.tokens}"
            if failure is not None:
                log.error("request %s (kvtransit id %d) fails: %s", req_id, load.wire_id, failure)
                self._invalid_blocks.update(load.block_ids)
                continue
            assert arrived.layers is not None
            for cache, layer in zip(self._caches, arrived.layers, strict=True):
                scatter_request_kv(cache, torch.from_numpy(layer), load.block_ids, load.start, load.tokens)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads complete before their request is scheduled (asynchronous loading)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # the whole prompt's KV is copied out once the step's forward is done (wait_for_save)

    def wait_for_save(self) -> None:
        if self._sender is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtransitMetadata)
        for send in meta.sends:
            first_token_ns = now_ns()  # the forward that computed the prompt's last token has just ended
            layers = [gather_request_kv(cache, send.block_ids, send.prompt_tokens).numpy() for cache in self._caches]
            self._sender.send(send.wire_id, layers, prompt_tokens=send.prompt_tokens,
                              output_tokens=send.output_tokens, first_token_ns=first_token_ns)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._receiver is not None and self._pending and not self._finished_recving:
            meta = self._connector_metadata
            if isinstance(meta, KvtransitMetadata) and meta.idle:
                self._receiver.wait(IDLE_WAIT_S)
            self._load_arrived()
        done, self._finished_recving = self._finished_recving, set()
        return None, done or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        invalid, self._invalid_blocks = self._invalid_blocks, set()
        return invalid

    def shutdown(self) -> None:
        if self._sender is not None:
            self._sender.close()
        if self._receiver is not None:
            self._receiver.close()


def _layer_index(name: str) -> int:
    match = _LAYER_INDEX.search(name)
    return int(match.group(1)) if match else 0


def _address(extra: dict[str, Any], key: str) -> tuple[str, int]:
    value = extra.get(key)
    host, _, port = str(value).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"KvtransitConnector: kv_connector_extra_config.{key} must be HOST:PORT, got {value!r}")
    return host, int(port)


__all__ = ["SUPPORTED_VLLM", "KvtransitConnector"]
