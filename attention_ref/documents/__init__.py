"""The five source documents: their printed values, and everything that checks them.

``printed_values`` (the documents' numbers, cited by file and section; data only; its
names are re-exported here, so ``attention_ref.documents.HULL`` works as before),
``worked_examples`` (004's two examples step by step), ``experiments`` (what decides each
checkable claim), ``claims`` (the claims table behind ``docs/claims.md``), ``toy_task``
(the model where two heads beat one), ``walkthrough`` (``python -m attention_ref``), ``book``
(``python -m attention_ref book OUT``: the lessons and docs as a website).
May import from every lower layer (``core``, ``variants``, ``nn``); submodules are imported
on use, so ``import attention_ref`` stays light.
"""
from .printed_values import *  # noqa: F401,F403
from .printed_values import __all__  # noqa: F401
