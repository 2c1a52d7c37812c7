"""examples/bert in one process, on the CPU: the text and its tokenizer, BERT's masking, the model's size, and the
loss going down. The runs across processes with each engine are in tests/test_bert_engines.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "bert"
sys.path.insert(0, str(EXAMPLE))

import bert  # noqa: E402
import pretrain  # noqa: E402
from bert import CLS, MASK, PAD, SEP, SPECIALS, UNK, Vocab, mask_tokens, sequences  # noqa: E402

LAUNCHERS = ("SCALETRAIN_ENGINE", "SCALETRAIN_REDUCERS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
             "OMPI_COMM_WORLD_SIZE")


@pytest.fixture(scope="module")
def text() -> str:
    return bert.corpus()


def test_the_text_is_pythons_own_manual(text):
    assert len(text) > 400_000 and "Assert statements are a convenient way" in text
    assert not re.search(r"^[*=~^-]{3,}[ \t]*$", text, flags=re.M)  # reST's heading underlines are dropped


def test_words_and_vocabulary():
    assert bert.words("The `assert` Statement, 3.14!") == ["the", "`", "assert", "`", "statement", ",", "3", ".",
                                                           "14", "!"]
    vocab = Vocab.build("b a b c b a d", 8)  # 5 specials + the 3 most frequent; ties alphabetical (a, c < d)
    assert vocab.tokens == SPECIALS + ["b", "a", "c"]
    assert vocab.encode("a d b") == [6, UNK, 5]
    assert vocab.decode([5, 6]) == "b a"
    assert len(Vocab.build("b a b c b a d", 100)) == 5 + 4  # no more words than the text has
    with pytest.raises(ValueError, match="more than the 5 special tokens"):
        Vocab.build("a", 5)


def test_every_rank_builds_the_same_vocabulary(text):
    # Another process with another string hash seed (each rank is one) builds the same list.
    code = "import bert, json; print(json.dumps(bert.Vocab.build(bert.corpus(), 2000).tokens))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=EXAMPLE,
                           env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    assert json.loads(other) == Vocab.build(text, 2000).tokens
    ids = Vocab.build(text, 2000).encode(text)
    assert len(ids) > 100_000 and sum(i == UNK for i in ids) / len(ids) < 0.05  # 2,000 words cover 95%+


def test_sequences_wrap_the_stream_in_cls_and_sep():
    rows = sequences(list(range(10, 21)), 5)  # 11 tokens, 3 a row: 3 rows, 2 left over
    assert rows.tolist() == [[CLS, 10, 11, 12, SEP], [CLS, 13, 14, 15, SEP], [CLS, 16, 17, 18, SEP]]
    assert sequences([7], 3).tolist() == [[CLS, 7, SEP]]  # the shortest row
    with pytest.raises(ValueError, match="seq_len must be >= 3"):
        sequences([7], 2)


def test_masking_chooses_15_percent_then_80_10_10(text):
    vocab = Vocab.build(text, 2000)
    tokens = sequences(vocab.encode(text), 128)  # ~900 x 128 real tokens
    inputs, labels = mask_tokens(tokens, len(vocab), torch.Generator().manual_seed(0))
    chosen = labels != -100
    maskable = tokens >= len(SPECIALS)
    n = int(chosen.sum())
    assert abs(n / int(maskable.sum()) - 0.15) < 0.005        # 15% of ~110k words: +-0.5% is ~5 sigma
    assert not (chosen & ~maskable).any()                     # [CLS], [SEP], [UNK] are never predicted
    assert torch.equal(labels[chosen], tokens[chosen])        # the label is the original word
    assert torch.equal(inputs[~chosen], tokens[~chosen])      # nothing else changes
    masked = (inputs[chosen] == MASK).sum() / n
    kept = (inputs[chosen] == tokens[chosen]).sum() / n
    swapped = 1 - masked - kept
    assert abs(masked - 0.8) < 0.01 and abs(kept - 0.1) < 0.01 and abs(swapped - 0.1) < 0.01
    assert (inputs[chosen & (inputs != MASK)] >= len(SPECIALS)).all()  # a random word, never a special
    assert chosen.any(dim=1).all()                            # every row predicts something


def test_masking_edge_rows():
    g = torch.Generator().manual_seed(1)
    # A row with one word: chance (15%) would mostly choose nothing, so that word is chosen; a row of specials
    # only has nothing to choose.
    tokens = torch.tensor([[CLS, 9, SEP, PAD], [CLS, SEP, PAD, PAD]])
    for _ in range(20):
        _, labels = mask_tokens(tokens, 50, g)
        assert labels.tolist() == [[-100, 9, -100, -100], [-100] * 4]
    # prob 0: one token a row all the same (the guarantee); prob 1: every word.
    tokens = torch.tensor([[CLS, 7, 8, 9, SEP]])
    assert int((mask_tokens(tokens, 50, g, prob=0.0)[1] != -100).sum()) == 1
    assert (mask_tokens(tokens, 50, g, prob=1.0)[1] == torch.tensor([[-100, 7, 8, 9, -100]])).all()


def test_bert_large_has_bert_larges_size():
    with torch.device("meta"):
        large = bert.BertMLM(bert.SIZES["large"])
        base = bert.BertMLM(bert.SIZES["base"])
    # BERT-large is "340M" and BERT-base "110M" in the paper (section 3), with the pooler and NSP head this
    # masked-LM-only model leaves out (1.05M and 0.6M parameters).
    assert bert.count_params(large) == 335_172_410
    assert bert.count_params(base) == 109_512_762
    assert sum(p.numel() for p in large.parameters()) * 2 / 1e6 == pytest.approx(670.3, abs=0.1)  # fp16 MB


def test_schedule_and_rank_split():
    assert pretrain.lr_at(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert pretrain.lr_at(9, 100, 1.0, 10) == pytest.approx(1.0)
    assert pretrain.lr_at(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert pretrain.lr_at(99, 100, 1.0, 10) == pytest.approx(1 / 90)
    data = torch.arange(20).view(10, 2)
    mine = [next(pretrain.batches(data, 5, r, 2, seed=3)) for r in range(2)]
    rows = sorted(int(x[0]) for b in mine for x in b)
    assert rows == list(range(0, 20, 2))  # the two ranks' first batches: every row once, none twice


def test_loss_goes_down_in_one_process(tmp_path, monkeypatch, capsys):
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)
    assert pretrain.main(["--steps", "40", "--log-every", "10", "--output", str(tmp_path), "--threads", "1"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["engine"], summary["ranks"], summary["size"]) == ("single", 1, "tiny")
    first, last = summary["losses"][0], summary["losses"][-1]
    assert first > 7.0 and last < first - 1.0, summary["losses"]  # ln(2000) = 7.6 at the start
    assert "summary: BERT-tiny 1 ranks (single)" in capsys.readouterr().out


def run_example(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in LAUNCHERS}
    return subprocess.run([sys.executable, str(EXAMPLE / "pretrain.py"), *args], capture_output=True, text=True,
                          env={**clean, "PYTHONPATH": str(ROOT), **env}, timeout=120)


@pytest.mark.parametrize(("args", "env", "line"), [
    (["--batch", "6", "--accumulate", "4"], {}, "error: --batch 6 must be a multiple of --accumulate 4"),
    (["--seq-len", "65"], {}, "error: --seq-len must be 3 to 64 for --size tiny, got 65"),
    (["--size", "huge"], {}, "error: argument --size: invalid choice: 'huge' (choose from 'base', 'large', 'tiny')"),
    ([], {"SCALETRAIN_ENGINE": "nccl"}, "error: SCALETRAIN_ENGINE=nccl: choose one of horovod, ddp, reducer"),
    ([], {"SCALETRAIN_ENGINE": "horovod", "RANK": "0", "WORLD_SIZE": "2"}, "error: SCALETRAIN_ENGINE=horovod needs "
                                                                           "mpirun"),
    # Issue 33 item 6: each trained (NaN, a negative rate) or ended in a traceback.
    (["--lr", "nan"], {}, "error: --lr must be a finite number >= 0 (0: the size's), got nan"),
    (["--lr", "inf"], {}, "error: --lr must be a finite number >= 0 (0: the size's), got inf"),
    (["--lr", "-1"], {}, "error: --lr must be a finite number >= 0 (0: the size's), got -1"),
    (["--dropout", "1"], {}, "error: --dropout must be a probability from 0 up to (not including) 1, got 1"),
    (["--dropout", "nan"], {}, "error: --dropout must be a probability from 0 up to (not including) 1, got nan"),
    (["--dropout", "-0.1"], {}, "error: --dropout must be a probability from 0 up to (not including) 1, got -0.1"),
    (["--warmup", "-1"], {}, "error: --warmup must be >= 0 steps, got -1"),
    (["--output", "/dev/null"], {}, "error: --output /dev/null is a file, not a directory"),
    (["--output", "/dev/null/run"], {}, "error: --output /dev/null/run: cannot write in /dev/null"),
])
def test_bad_input_is_one_line(args, env, line):
    proc = run_example("--steps", "1", *args, **env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(line), proc.stderr


@pytest.mark.parametrize(("lr", "dropout"), [("0", "0"), ("1e-4", "0.99")])
def test_the_edges_of_the_ranges_are_allowed(lr, dropout):
    """The other side of the boundaries above: --lr 0 (the size's) and a dropout just under 1."""
    args = pretrain.parse_args(["--lr", lr, "--dropout", dropout, "--warmup", "0"])
    assert (args.lr, args.dropout, args.warmup) == (float(lr), float(dropout), 0)


def test_ctrl_c_is_one_line_and_130(tmp_path):
    """Ctrl-C mid-run: one line and the status a shell gives SIGINT, no KeyboardInterrupt traceback."""
    import signal
    import time

    clean = {k: v for k, v in os.environ.items() if k not in LAUNCHERS}
    proc = subprocess.Popen([sys.executable, str(EXAMPLE / "pretrain.py"), "--steps", "100000", "--log-every", "1",
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**clean, "PYTHONPATH": str(ROOT)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().startswith("pretraining BERT-tiny")
        assert proc.stdout.readline().startswith("step 1 loss")
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err == "error: interrupted\n", (proc.returncode, err)
