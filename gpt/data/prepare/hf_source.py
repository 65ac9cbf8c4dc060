"""A Hugging Face dataset as a source (datasets.load_dataset, downloaded or streamed): its
records in order, resumable from any one, with progress where the dataset knows its size."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from gpt.core import network
from gpt.data.prepare.config import PrepareError
from gpt.data.prepare.pieces import Position, Record, Task, TextTaskBuilder, record_text


class HFSource:
    """A Hugging Face dataset through datasets.load_dataset (downloaded or streamed)."""

    def __init__(self, name: str, subset: str | None, split: str, streaming: bool, text_field: str) -> None:
        self.name, self.subset, self.split = name, subset, split
        self.streaming, self.text_field = streaming, text_field
        self._total: int | None = None
        self._seen = 0

    def identity(self) -> dict[str, Any]:
        return {"kind": "huggingface", "dataset": self.name, "subset": self.subset,
                "split": self.split, "streaming": self.streaming}

    def describe(self) -> str:
        sub = f" ({self.subset})" if self.subset else ""
        return f"{self.name}{sub} split {self.split}{', streaming' if self.streaming else ''}"

    def fraction(self) -> float | None:
        return min(1.0, self._seen / self._total) if self._total else None

    def _load(self) -> Any:
        # Without network: a stream cannot start, and a download is read from the cache
        # alone, at once (not after the library's retries); asked before the import, which
        # fails on an address it cannot parse
        offline = network.hub_unreachable()
        import datasets  # looked up at call time, so tests can stand in for load_dataset

        if offline is not None and self.streaming:
            raise PrepareError(f"--source {self.name} --streaming: streaming reads the Hugging "
                               f"Face hub, which cannot be reached ({offline}); go online, or "
                               f"drop --streaming to read a copy already downloaded")
        try:
            with network.offline_hub() if offline is not None else contextlib.nullcontext():
                return datasets.load_dataset(self.name, name=self.subset, split=self.split,
                                             streaming=self.streaming)
        except Exception as e:  # hub, network and config errors come in many types
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if offline is not None:
                raise PrepareError(
                    f"--source {self.name}: not in Hugging Face datasets' cache (subset "
                    f"{self.subset!r}, split {self.split!r}), and the hub cannot be reached "
                    f"({offline}): download it once with network, or give a local file or "
                    f"folder") from None
            raise PrepareError(
                f"--source {self.name}: cannot load the Hugging Face dataset "
                f"(subset {self.subset!r}, split {self.split!r}): {detail}; check the name, "
                f"--subset, --split and the network (there is no local file or folder of "
                f"that name either)"
            ) from None

    def _count(self, ds: Any) -> int | None:
        """Number of examples if known: len() when downloaded, else the dataset card's."""
        if not self.streaming:
            try:
                return len(ds)
            except TypeError:
                pass
        try:
            return int(ds.info.splits[self.split].num_examples) or None
        except Exception:  # no info or no split sizes on the card: the total is unknown
            return None

    def records(self, skip: int = 0) -> Iterator[Record]:
        """Examples from index `skip` on, as records."""
        ds = self._load()
        features = getattr(ds, "features", None)
        if features is not None and self.text_field not in features:
            raise PrepareError(
                f"--source {self.name}: no field {self.text_field!r} (fields: "
                f"{', '.join(features)}); choose one with --text-field"
            )
        self._total = self._count(ds)
        if features is not None and hasattr(ds, "select_columns"):
            ds = ds.select_columns([self.text_field])  # do not decode the other columns
        if skip:
            ds = ds.skip(skip) if hasattr(ds, "skip") else itertools.islice(ds, skip, None)
        self._seen = skip
        if features is None or not hasattr(ds, "iter"):  # a plain iterable of dicts
            for i, example in enumerate(ds, skip):
                self._seen = i + 1
                yield (record_text(example, self.text_field, f"--source {self.name} example {i}"),)
            return
        # Batches of one column: far cheaper than a Python dict per example.
        for batch in ds.iter(batch_size=1024):
            for text in batch[self.text_field]:
                if text is not None and not isinstance(text, str):  # _text_of raises the error
                    record_text({self.text_field: text}, self.text_field,
                             f"--source {self.name} example {self._seen}")
                self._seen += 1
                yield (text or "",)

    def tasks(self, start: Position, piece_chars: int, task_chars: int) -> Iterator[Task]:
        texts = TextTaskBuilder(start, piece_chars, task_chars)
        for index, record in enumerate(self.records(start.record), start.record):
            yield from texts.add(index, record)
        yield from texts.flush()
