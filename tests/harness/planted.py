"""The user's module that the tests of ``rbcheck validate`` run from a
directory of their own (test_cli.py, test_no_false_pass.py,
test_report_browser.py): the README's list buffer with a planted bug, its
sampler never drawing the last slot (``broken()``), which the uniform
sampling property (``UNIFORM``) catches. A test writes ``SKIPS_LAST`` (plus
its own factories) to a file of that directory."""

from __future__ import annotations

UNIFORM = "test_sampling_distributions::test_uniform_sampling_matches_closed_form"

SKIPS_LAST = '''
from dataclasses import replace

import torch

from rbcheck.harness.examples.list_buffer import ListBuffer, adapter as example


class SkipsLastSlot(ListBuffer):
    def sample(self, batch_size):
        u = torch.rand(batch_size, generator=self.generator, dtype=torch.float64)
        index = (u * max(len(self.rows) - 1, 1)).long()
        return self.contents()[index], {"index": index}


def broken():
    return replace(example(), name="skips-last", make=lambda spec: SkipsLastSlot(spec.capacity, spec.seed))
'''
