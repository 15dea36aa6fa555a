"""What the tool concludes from what the GPU code wrote; it imports no GPU code. The dataset and its evidence
(`dataset`, `evidence`, `candidates`, `explain`, `diff`), traces (`trace/`), programs (`audit/`,
`steps`, `graphs`, `grouped`, `stalls`), proofs of advice (`proof`) and first steps (`coldstart`, whose `run`
starts the GPU children of `cold-start` as processes; its analysis runs anywhere)."""
