"""The table of what tp divides (`models.tp.SPLIT_FIELDS`) names each kind's real fields, and
has every kind but the two whose split is the vocabulary's (`local_vocab`)."""

import typing

import pytest

from octodsl.models.spec import Layer
from octodsl.models.tp import SPLIT_FIELDS

CONFIGS = {
    cls.model_fields["kind"].default: cls for cls in typing.get_args(typing.get_args(Layer)[0])
}


@pytest.mark.parametrize("kind", sorted(SPLIT_FIELDS))
def test_every_split_field_is_a_field_of_its_kind(kind):
    assert set(SPLIT_FIELDS[kind]) <= set(CONFIGS[kind].model_fields)


def test_a_new_layer_kind_must_be_entered_in_the_table():
    assert set(CONFIGS) - set(SPLIT_FIELDS) == {"embedding", "lm_head_loss"}
