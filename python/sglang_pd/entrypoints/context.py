"""What route handlers need, stored once on ``app.state.ctx`` (no module globals)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sglang_pd.frontend.tokenizer_manager import TokenizerManager
from sglang_pd.protocol import EngineReady, Slo
from sglang_pd.request_params import default_slo
from sglang_pd.server_args import ServerArgs


@dataclass
class ServerContext:
    server_args: ServerArgs
    tm: TokenizerManager
    started_at: float = field(default_factory=time.time)

    @property
    def engine_info(self) -> EngineReady:
        return self.tm.engine_info

    @property
    def default_slo(self) -> Slo | None:
        """The server's ``--slo-ttft-ms`` / ``--slo-tpot-ms``: what requests without their own get."""
        return default_slo(self.server_args.slo_ttft_ms, self.server_args.slo_tpot_ms)

    @property
    def model_name(self) -> str:
        return self.server_args.served_model_name or self.engine_info.served_model_name or \
            self.server_args.model_path
