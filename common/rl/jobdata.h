// jobdata.h - job records in Redis shared by the services: the uploaded dataset of a job
// (job:{j}:data, one JSONL record per list entry) parsed back into a dataset.
#ifndef MARLAAS_JOBDATA_H
#define MARLAAS_JOBDATA_H

#include "common/net/store.h"
#include "common/rl/jobspec.h"
#include "common/tasks/dataset.h"

// The dataset a job uploaded, validated with the job's verifier spec. NULL + err when it is
// missing or does not parse (it was validated at submission, so that means damage).
dataset_t *jobdata_dataset(store_t *st, const char *job, const jobspec_t *spec, char *err);

#endif
