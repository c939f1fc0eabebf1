"""The KV store keys notes by the weights that wrote them and, when asked, by the user (issue 48).

- A local model folder whose weights change in place: the next prefill reads 0 stored tokens
  (before the change, the same prefill read the whole document but its partial last block).
- KVNOTES_STORE_SCOPE=user: user B's prefill of A's document reads 0 stored tokens; A's own reads it.
- A manifest's metadata is covered by its checksum, and an object that holds other token ids or
  another model's notes than its key says (a poisoned object, a valid checksum) is a miss, deleted.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.engine.conftest import MODEL, notes
from worker.engine.loaded import LoadedModel
from worker.engine.models import load_model
from worker.engine.store import KVStore
from worker.engine.store_files import file_bytes, verified
from worker.engine.tiny import byte_tokenizer

DOCUMENT = "Account record. status: active. owner: Ada Lovelace. " * 8  # ~430 tokens (bytes)


def _folder(tmp_path: Path) -> Path:
    """tiny-llama saved as a local model folder (config, safetensors weights, tokenizer)."""
    folder = tmp_path / "model"
    model, tokenizer, _ = load_model("tiny-llama")
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def _loaded(folder: Path, store: KVStore) -> LoadedModel:
    model, tokenizer, info = load_model(str(folder))
    return LoadedModel(model, tokenizer, info, store)


def test_a_model_folder_whose_weights_change_reads_no_notes_the_old_weights_wrote(tmp_path) -> None:
    folder = _folder(tmp_path)
    store = KVStore(tmp_path / "kv", block_tokens=16)
    first = _loaded(folder, store)
    notes_a = first.prefill(DOCUMENT)
    n_tokens = len(notes_a.token_ids)
    assert first.last_reuse.tokens == 0

    again = _loaded(folder, store)  # the same weights loaded again (a worker restarted)
    again.prefill(DOCUMENT)
    assert again.last_reuse.tokens >= 0.9 * n_tokens, (again.last_reuse, n_tokens)
    assert again.model_key == first.model_key

    model, _, _ = load_model(str(folder))  # fine-tuned in place: same config, same shapes
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model.save_pretrained(folder)
    changed = _loaded(folder, store)
    assert changed.model_key != first.model_key
    notes_c = changed.prefill(DOCUMENT)
    assert changed.last_reuse.tokens == 0
    assert not torch.equal(notes_c.layers[0][0], notes_a.layers[0][0])  # other weights, other notes

    moved = tmp_path / "elsewhere"  # the same files in another folder: the same fingerprint (a path
    shutil.copytree(folder, moved)  # is its own alias; a bundled alias on another host is the same)
    assert _loaded(moved, store).model_key.split(":")[-1] == changed.model_key.split(":")[-1]


def test_a_user_scope_reads_only_that_users_notes(tmp_path) -> None:
    model, tokenizer, info = load_model("tiny-llama")
    eng = LoadedModel(model, tokenizer, info, KVStore(tmp_path / "kv", block_tokens=16))
    with eng.scoped("alice"):
        n_tokens = len(eng.prefill(DOCUMENT).token_ids)
        assert eng.last_reuse.tokens == 0
        eng.prefill(DOCUMENT)
        assert eng.last_reuse.tokens >= 0.9 * n_tokens
    with eng.scoped("bob"):
        eng.prefill(DOCUMENT)
        assert eng.last_reuse.tokens == 0  # B's run of A's document
        assert "bob" not in eng.model_key  # the salt names nobody in a shared bucket
    eng.prefill(DOCUMENT)
    assert eng.last_reuse.tokens == 0  # the deployment's scope holds neither user's
    with eng.scoped("alice"):
        eng.prefill(DOCUMENT)
        assert eng.last_reuse.tokens >= 0.9 * n_tokens


def test_the_worker_scopes_by_the_runs_user_only_when_asked(monkeypatch) -> None:
    from data.settings import get_settings
    from worker.mapping import store_owner

    monkeypatch.delenv("KVNOTES_STORE_SCOPE", raising=False)
    get_settings.cache_clear()
    assert store_owner("alice") is None  # the default: the deployment's notes, shared
    monkeypatch.setenv("KVNOTES_STORE_SCOPE", "user")
    get_settings.cache_clear()
    try:
        assert store_owner("alice") == "alice" and store_owner(None) == "local"
    finally:
        monkeypatch.delenv("KVNOTES_STORE_SCOPE")
        get_settings.cache_clear()


def _rewrite(path: Path, **changes: str) -> None:
    """Change a file's metadata, keeping its old checksum."""
    tensors, meta = verified(path.read_bytes())
    from safetensors.torch import save

    path.write_bytes(save(tensors, metadata={**meta, **changes}))


@pytest.mark.parametrize("field,value", [("first_position", "7"), ("segments", ""),
                                         ("model_key", "other:float32")])
def test_a_manifests_metadata_is_covered_by_its_checksum(store: KVStore, field, value) -> None:
    ids = list(range(100, 140))
    key = store.put(MODEL, ids, notes(40, seed=1), segments=["sink"] + ["skill"] * 39, first_position=2)
    _rewrite(store._path("seq", key), **{field: value})
    assert store.get_entry(key) is None
    assert store.stats()["corrupt"] == 1 and not store._path("seq", key).exists()


def test_a_manifest_or_block_under_another_key_is_a_miss(store: KVStore) -> None:
    ids_a, ids_b = list(range(100, 140)), list(range(200, 240))
    key_a = store.put(MODEL, ids_a, notes(40, seed=1))
    key_b = store._seq_key(MODEL, ids_b)
    # a valid file (its checksum right) copied under B's name: it claims A's token ids
    store._path("seq", key_b).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(store._path("seq", key_a), store._path("seq", key_b))
    assert store.get_entry(key_b) is None
    assert store.stats()["corrupt"] == 1

    block_a = store._block_keys(MODEL, ids_a)[0]
    block_b = store._block_keys(MODEL, ids_b)[0]
    store._path("block", block_b).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(store._path("block", block_a), store._path("block", block_b))
    assert store.get_prefix(MODEL, ids_b) == (0, None)
    assert not store._path("block", block_b).exists()

    # a block written for another model key, under this model's key (its token ids right)
    tensors, meta = verified(store._path("block", block_a).read_bytes())
    store._path("block", block_a).write_bytes(file_bytes(tensors, {**meta, "model_key": "other"}))
    assert store.get_prefix(MODEL, ids_a) == (0, None)
    assert store.stats()["corrupt"] == 3
    # the manifest's block list is derived again from its ids: A's whole sequence is now a miss too
    assert json.loads(verified(store._path("seq", key_a).read_bytes())[1]["blocks"])[0] == block_a
    assert store.get_entry(key_a) is None


def test_a_job_that_records_no_user_runs_without_the_store_under_a_user_scope(tmp_path, monkeypatch) -> None:
    """A trajectory records no user: under KVNOTES_STORE_SCOPE=user it neither reads nor writes the
    store (its timing tells nobody what another user prefilled); under the deployment scope it does."""
    from data.settings import get_settings
    from worker.mapping import unowned_job_store

    model, tokenizer, info = load_model("tiny-llama")
    store = KVStore(tmp_path / "kv", block_tokens=16)
    eng = LoadedModel(model, tokenizer, info, store)
    eng.prefill(DOCUMENT)  # what some user's run left in the deployment's notes
    try:
        monkeypatch.setenv("KVNOTES_STORE_SCOPE", "user")
        get_settings.cache_clear()
        with unowned_job_store(eng):
            assert eng.store is None
            eng.prefill(DOCUMENT)
            assert eng.last_reuse is None
        assert eng.store is store
        monkeypatch.setenv("KVNOTES_STORE_SCOPE", "deployment")
        get_settings.cache_clear()
        with unowned_job_store(eng):
            eng.prefill(DOCUMENT)
            assert eng.last_reuse.tokens > 0
    finally:
        monkeypatch.delenv("KVNOTES_STORE_SCOPE")
        get_settings.cache_clear()
