"""`POST /classify`: a sequence-classification model (a discriminative reward model) served in
vLLM's classification dialect, so the worker's `rm` reward source talks to this engine and to
vLLM alike. The engine serves such a model instead of a chat model when the folder's config
names a `...ForSequenceClassification` architecture.

Probabilities are the softmax of the logits, or the sigmoid of the one logit of a one-class
(reward) head, as vLLM's classify activation gives them.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from claw_stream.dialect import OpenAIError
from claw_stream.engine.openai import protocol as p
from claw_stream.http_errors import install_error_handlers


def is_classifier(model_path: Path) -> bool:
    """Whether the folder holds a sequence-classification model (its config.json says so)."""
    try:
        config = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or [])


class Classifier:
    """The model and its tokenizer; one forward pass at a time (CPU threads are the limit)."""

    def __init__(self, model_path: Path, device: str = "cpu", max_model_len: int | None = None):
        self.model_path = model_path
        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_path)
        model: Any = AutoModelForSequenceClassification.from_pretrained(model_path)
        self.model = model.to(device).eval()
        if self.model.config.pad_token_id is None:
            # a batch of one needs no padding, but the head looks for the last non-pad token
            self.model.config.pad_token_id = self.tokenizer.pad_token_id or 0
        self.device = device
        limit = getattr(self.model.config, "max_position_embeddings", None) or 2048
        self.max_model_len = min(max_model_len or limit, limit)
        self.labels: dict[int, str] = {
            int(k): str(v) for k, v in (self.model.config.id2label or {}).items()
        }
        self._lock = threading.Lock()

    @torch.no_grad()
    def classify(self, text: str) -> tuple[list[float], int]:
        """(probabilities per class, prompt tokens) of one text."""
        ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        if len(ids) > self.max_model_len:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your request has {len(ids)} input tokens.",
                param="input",
            )
        with self._lock:
            logits = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0]
        logits = logits.float()
        probs = torch.sigmoid(logits) if logits.numel() == 1 else torch.softmax(logits, -1)
        return [float(x) for x in probs], len(ids)


class ClassifyHandler:
    def __init__(self, classifier: Classifier, served_model_name: str):
        self.classifier = classifier
        self.served_model_name = served_model_name

    def models(self) -> p.ModelList:
        card = p.ModelCard(
            id=self.served_model_name,
            root=str(self.classifier.model_path),
            max_model_len=self.classifier.max_model_len,
        )
        return p.ModelList(data=[card])

    async def create_classification(
        self, body: p.ClassificationRequest
    ) -> p.ClassificationResponse:
        if body.model not in (None, "", self.served_model_name):
            raise OpenAIError(404, f"The model `{body.model}` does not exist.", param="model")
        texts = [body.input] if isinstance(body.input, str) else body.input
        data, n_tokens = [], 0
        for i, text in enumerate(texts):
            probs, n = await run_in_threadpool(self.classifier.classify, text)
            n_tokens += n
            top = max(range(len(probs)), key=probs.__getitem__)
            label = self.classifier.labels.get(top) if len(probs) > 1 else None
            data.append(
                p.ClassificationData(index=i, label=label, probs=probs, num_classes=len(probs))
            )
        usage = p.UsageInfo(prompt_tokens=n_tokens, total_tokens=n_tokens)
        return p.ClassificationResponse(model=self.served_model_name, data=data, usage=usage)


router = APIRouter()


def _handler(raw: Request) -> ClassifyHandler:
    handler: ClassifyHandler = raw.app.state.classify_handler
    return handler


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@router.get("/v1/models")
async def models(raw: Request) -> p.ModelList:
    return _handler(raw).models()


@router.post("/classify")
@router.post("/v1/classify")
async def classify(body: p.ClassificationRequest, raw: Request) -> p.ClassificationResponse:
    return await _handler(raw).create_classification(body)


def create_classify_app(classifier: Classifier, served_model_name: str) -> FastAPI:
    app = FastAPI(title="claw-stream engine (classify)", version="1")
    install_error_handlers(app, validation_status=400)
    app.state.classify_handler = ClassifyHandler(classifier, served_model_name)
    app.include_router(router)
    return app
