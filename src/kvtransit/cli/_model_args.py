"""Flags several calculators share: which model (by name or by shape)."""

from __future__ import annotations

import argparse


def add_model_flags(parser: argparse.ArgumentParser, default: str | None = "llama3-8b") -> None:
    from kvtransit.model.catalog.models import MODELS

    group = parser.add_mutually_exclusive_group()
    group.add_argument("--model", choices=sorted(MODELS), default=None,
                       help=f"a catalogued model (default {default})" if default else "a catalogued model")
    group.add_argument("--model-shape", metavar="SHAPE", default=None,
                       help="a model by its shape: layers=32,d_model=4096,heads=32,kv_heads=8,d_ff=14336,vocab=128256"
                            "[,experts=8,experts_active=2,name=my-model]")
    parser.set_defaults(model_default=default)


def model_from_args(args: argparse.Namespace):
    from kvtransit.model.catalog.models import ModelSpec, model_by_name

    if args.model_shape is not None:
        return ModelSpec.from_shape(args.model_shape)
    return model_by_name(args.model or args.model_default)
