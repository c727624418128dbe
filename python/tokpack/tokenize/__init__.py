"""Raw chat / instruction / text data (and TRL-style preference and KTO data, GRPO records and
per-turn chats as prefix trees) to token shards with loss masks.

``tokenize_files`` writes Parquet token shards and a manifest; ``tokenize_to_batches`` yields
the same batches without writing (for tokenize-and-pack in one run). Needs the ``tokenize``
extra (``tokenizers``, ``jinja2``)."""

from .formats import DEFAULT_COLUMNS, FORMATS
from .options import TokenizeOptions
from .pipeline import TokenizeStats, TokenStream, tokenize_to_batches
from .schema import KTO_SCHEMA, PREFERENCE_SCHEMA, TOKEN_SCHEMA, TREE_SCHEMA
from .template import CHATML_TEMPLATE, TRAIN_ON
from .tokenizer import LoadedTokenizer, load_tokenizer
from .writer import REJECTED_NAME, tokenize_files

__all__ = [
    "tokenize_files",
    "tokenize_to_batches",
    "TokenStream",
    "TokenizeOptions",
    "TokenizeStats",
    "LoadedTokenizer",
    "load_tokenizer",
    "TOKEN_SCHEMA",
    "PREFERENCE_SCHEMA",
    "KTO_SCHEMA",
    "TREE_SCHEMA",
    "FORMATS",
    "TRAIN_ON",
    "DEFAULT_COLUMNS",
    "CHATML_TEMPLATE",
    "REJECTED_NAME",
]
