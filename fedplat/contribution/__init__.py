"""Contribution accounting: who helped the model, a tamper-evident ledger, rewards.

* scorers (pure): GTG-Shapley, exact Shapley, leave-one-out
  (:mod:`~fedplat.contribution.shapley`, :mod:`~fedplat.contribution.loo`) over a
  cached coalition utility (:mod:`~fedplat.contribution.utility`), and cosine
  similarity to the robust aggregate (:mod:`~fedplat.contribution.similarity`);
* flags from the aggregator's decisions, free-riding and score outliers
  (:mod:`~fedplat.contribution.flags`);
* reward shares (:mod:`~fedplat.contribution.rewards`);
* the hash-chained, Ed25519-signed ledger (:mod:`~fedplat.contribution.ledger`,
  :mod:`~fedplat.security.keys`);
* the coordinator hook :class:`ContributionAccountant`
  (:mod:`~fedplat.contribution.accountant`), which values a round
  (:mod:`~fedplat.contribution.valuation`), labels it
  (:mod:`~fedplat.contribution.labelling`), keeps the run's totals
  (:mod:`~fedplat.contribution.standings`) and returns the round's ledger record
  (:mod:`~fedplat.contribution.record`) for the coordinator to store; its results
  are typed in :mod:`~fedplat.contribution.results`.

See docs/contribution.md.
"""

from fedplat.contribution.accountant import ContributionAccountant, ContributionStore
from fedplat.contribution.config import ContributionSection, FlagSection, GTGSection
from fedplat.contribution.ledger import LedgerEntry, LedgerHead
from fedplat.contribution.ledger_export import export_ledger
from fedplat.contribution.ledger_verify import (
    LedgerProblem,
    LedgerReport,
    verify_ledger,
    verify_run_ledger,
)
from fedplat.contribution.loo import leave_one_out
from fedplat.contribution.results import (
    ClientContribution,
    ClientStanding,
    ContributionCost,
    ContributionError,
    PendingRecord,
    RoundContribution,
)
from fedplat.contribution.rewards import reward_shares
from fedplat.contribution.scorers import (
    available_scorers,
    get_scorer,
    register_scorer,
)
from fedplat.contribution.shapley import (
    GTGResult,
    GTGSettings,
    exact_shapley,
    gtg_shapley,
)
from fedplat.contribution.similarity import cosine_to_reference
from fedplat.contribution.utility import (
    SubsetUtility,
    UtilityError,
    make_utility_from_metric,
)
from fedplat.security.keys import (
    KeyFileError,
    key_id,
    load_or_create_signing_key,
    load_public_key,
    load_signing_key,
    public_key_pem,
)

__all__ = [
    "ClientContribution",
    "ClientStanding",
    "ContributionAccountant",
    "ContributionCost",
    "ContributionError",
    "ContributionSection",
    "ContributionStore",
    "FlagSection",
    "GTGResult",
    "GTGSection",
    "GTGSettings",
    "KeyFileError",
    "LedgerEntry",
    "LedgerHead",
    "LedgerProblem",
    "LedgerReport",
    "PendingRecord",
    "RoundContribution",
    "SubsetUtility",
    "UtilityError",
    "available_scorers",
    "cosine_to_reference",
    "exact_shapley",
    "export_ledger",
    "get_scorer",
    "gtg_shapley",
    "key_id",
    "leave_one_out",
    "load_or_create_signing_key",
    "load_public_key",
    "load_signing_key",
    "make_utility_from_metric",
    "public_key_pem",
    "register_scorer",
    "reward_shares",
    "verify_ledger",
    "verify_run_ledger",
]
