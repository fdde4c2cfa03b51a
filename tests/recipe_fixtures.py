"""Small stand-ins for the recipes' downloads, laid out like the real ones (a few dozen lines each).

Sentences come from a toy word-for-word "translation" between German, English and French, with the things
the real corpora have and the pipelines must handle: capitals, punctuation, hyphenated compounds, curly
apostrophes, XML/SGM markup around the segments and metadata lines in IWSLT's training files.
"""

import gzip
import random
from pathlib import Path

_WORDS = [  # (de, en, fr)
    ("Hund", "dog", "chien"), ("Katze", "cat", "chat"), ("Mann", "man", "homme"), ("Frau", "woman", "femme"),
    ("läuft", "runs", "court"), ("spielt", "plays", "joue"), ("im", "in the", "dans le"), ("Park", "park", "parc"),
    ("rot", "red", "rouge"), ("groß", "big", "grand"), ("Ball", "ball", "balle"), ("Straße", "street", "rue"),
    ("Kind", "child", "enfant"), ("sieht", "sees", "voit"), ("Haus", "house", "maison"), ("blau", "blue", "bleu"),
    ("E-Mail", "e-mail", "e-mail"), ("schnell", "fast", "vite"), ("Wasser", "water", "eau"), ("mit", "with", "avec"),
]  # fmt: skip
LANGS = ("de", "en", "fr")


def sentences(n: int, seed: int) -> dict[str, list[str]]:
    """``n`` parallel sentences per language of LANGS."""
    rng = random.Random(seed)
    out: dict[str, list[str]] = {lang: [] for lang in LANGS}
    for i in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 9))]
        end = rng.choice([".", "!", "?"])
        for k, lang in enumerate(LANGS):
            text = " ".join(w[k] for w in words)
            if i % 7 == 3:
                text = text + " \u2019s"  # a curly apostrophe, which the IWSLT/WMT scripts straighten
            out[lang].append(text[0].upper() + text[1:] + end)
    return out


def write_gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def write_text(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def make_multi30k(root: Path, sizes=(("train", 80), ("val", 12), ("test_2016_flickr", 13))) -> Path:
    """``root/{train,val,test_2016_flickr}.{de,en,fr}.gz`` as in multi30k/dataset data/task1/raw."""
    for seed, (split, n) in enumerate(sizes):
        for lang, lines in sentences(n, seed).items():
            write_gz(root / f"{split}.{lang}.gz", lines)
    return root


IWSLT_TESTS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
               "IWSLT14.TED.tst2012")  # fmt: skip


def make_iwslt14(root: Path, n_train: int = 120, n_test: int = 5) -> Path:
    """``root/de-en/`` as in de-en.tgz: train.tags files with talk metadata, XML test sets."""
    d = root / "de-en"
    train = sentences(n_train, 10)
    for lang in ("de", "en"):
        lines = []
        for i, line in enumerate(train[lang]):
            if i % 40 == 0:
                lines += [f"<url>http://www.ted.com/talks/{i}</url>", f"<keywords>talk {i}</keywords>",
                          f"<talkid>{i}</talkid>", f"<title>{line}</title>"]  # fmt: skip
                continue  # the title replaces a sentence on both sides: the files stay parallel
            lines.append(line)
        write_text(d / f"train.tags.de-en.{lang}", lines)
    for k, stem in enumerate(IWSLT_TESTS):
        test = sentences(n_test, 20 + k)
        for lang in ("de", "en"):
            body = [f'<seg id="{i + 1}"> {line} </seg>' for i, line in enumerate(test[lang])]
            write_text(d / f"{stem}.de-en.{lang}.xml", ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>",
                       f'<srcset setid="{stem}" srclang="{lang}">', '<doc docid="1" genre="lectures">',
                       *body, "</doc>", "</srcset>", "</mteval>"])  # fmt: skip
    return root


WMT_TRAIN = {
    "en-de": ("training/europarl-v7.de-en", "commoncrawl.de-en", "training/news-commentary-v9.de-en"),
    "en-fr": ("training/europarl-v7.fr-en", "commoncrawl.fr-en", "un/undoc.2000.fr-en",
              "training/news-commentary-v9.fr-en", "giga-fren.release2.fixed"),
}  # fmt: skip


def make_wmt14(root: Path, pair: str = "en-de", years=(2010, 2011, 2012, 2013, 2014, 2015, 2016),
               n_train: int = 40, n_test: int = 6) -> Path:  # fmt: skip
    """Training corpora as the WMT archives unpack, and the SGM test sets sacrebleu's metadata names."""
    from sacrebleu.dataset import DATASETS

    other = pair.split("-")[1]
    for k, stem in enumerate(WMT_TRAIN[pair]):
        text = sentences(n_train, 30 + k)
        for lang in ("en", other):
            if stem.startswith("giga"):
                write_gz(root / f"{stem}.{lang}.gz", text[lang])  # giga-fren ships gzipped files
            else:
                write_text(root / f"{stem}.{lang}", text[lang])
    for year in years:
        name = "wmt14/full" if year == 2014 else f"wmt{year % 100}"
        src, ref = DATASETS[name].langpairs[pair][:2]
        text = sentences(n_test, year)
        for path, lang, kind in ((src, "en", "srcset"), (ref, other, "refset")):
            body = [f'<seg id="{i + 1}">{line}</seg>' for i, line in enumerate(text[lang])]
            write_text(root / path, [f'<{kind} setid="newstest{year}" srclang="any">', '<doc docid="a" origlang="en">',
                                     *body, "</doc>", f"</{kind}>"])  # fmt: skip
    return root


def make_opus100(root: Path, langs=("de", "fr"), n_train: int = 40, n_dev: int = 6, n_test: int = 5,
                 train_only=()) -> Path:  # fmt: skip
    """``root/opus-100-corpus/v1.0/supervised/L1-L2/opus.L1-L2-{train,dev,test}.L`` (pairs sorted by name).

    ``train_only`` languages get a training set only, as an, dz, hy, mn and yo in the real corpus (their
    text is the German side of the toy corpus)."""
    for k, lang in enumerate((*langs, *train_only)):
        pair = "-".join(sorted((lang, "en")))
        d = root / "opus-100-corpus" / "v1.0" / "supervised" / pair
        splits = (("train", n_train),) if lang in train_only else (("train", n_train), ("dev", n_dev), ("test", n_test))
        for split, n in splits:
            text = sentences(n, 40 + 3 * k + len(split))
            for side in (lang, "en"):
                write_text(d / f"opus.{pair}-{split}.{side}", text[side if side in LANGS else "de"])
    return root
