"""CPU only: what the tool concludes from what the GPU code wrote. The dataset and its evidence
(`dataset`, `evidence`, `candidates`, `explain`, `diff`), traces (`trace/`), programs (`audit/`,
`steps`, `graphs`, `grouped`, `stalls`) and first steps (`coldstart`)."""
