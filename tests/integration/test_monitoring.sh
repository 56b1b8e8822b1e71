#!/usr/bin/env bash
# The monitoring kit (deploy/k8s/components/monitoring: Grafana dashboard, PrometheusRule,
# PodMonitor), checked offline:
#   - deploy/k8s/check-monitoring/check.mjs (npm packages pinned in its package-lock.json,
#     installed once into build/monitoring-check): the dashboard's structure (uid, panels with
#     unique ids and datasource and targets, gridPos inside 24 columns without overlaps, variables
#     defined), every PromQL expression of the dashboard and the rules parsed with Prometheus's
#     grammar (lezer-promql), every metric name exported by the C code (read from common/ and
#     services/), labels that exist where they are used, rate() of counters only, every alert
#     with for:, a severity and summary and description annotations;
#   - promtool (Debian's prometheus package): `promtool check rules` on the rules and on every
#     dashboard expression as a recording rule (Prometheus's own parser), and the alert unit tests
#     of deploy/k8s/check-monitoring/alerts_test.yaml (`promtool test rules`: when each alert
#     fires, with which labels);
#   - `kubectl kustomize` renders the cpu and gpu overlays with the component (an overlay made in
#     build/, as README.md shows); check.mjs checks the rendered PodMonitor (schema and fields of
#     the operator's API, the pods it selects, their port, the job label), PrometheusRule and
#     dashboard ConfigMap (label grafana_dashboard: "1", the file byte for byte), and
#     deploy/k8s/check/validate.js the objects of Kubernetes' own kinds;
#   - broken variants (bad PromQL, an unknown metric, a duplicate panel id, overlapping panels, a
#     gauge under rate(), an undefined variable, an alert without for: or severity, a wrong port,
#     a wrong dashboard label, an alert whose window changed) must each be refused.
# Skipped (77) when the npm registry cannot be reached for the first install; the component's
# rendering needs kubectl 1.21+ (kustomize components): with an older kubectl the rest runs and the
# test is skipped, saying so.
set -euo pipefail
fail=0
for tool in kubectl node npm promtool; do
    command -v $tool >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
COMP=deploy/k8s/components/monitoring
DASH=$COMP/dashboards/marlaas.json
RULES=$COMP/prometheusrule.yaml
CHECK=deploy/k8s/check-monitoring
bash tests/npm_install_once.sh $CHECK build/monitoring-check "the monitoring checker's PromQL parser and schemas"
bash tests/npm_install_once.sh deploy/k8s/check build/deploy-check "the manifest checker's schemas"
# check.mjs is an ES module: it finds its packages next to itself
mkdir -p "$TMP/check"
cp $CHECK/check.mjs "$TMP/check/"
ln -s "$PWD/build/monitoring-check/node_modules" "$TMP/check/node_modules"
check() { node "$TMP/check/check.mjs" --sources common services "$@"; }

# --- the files as they are ---------------------------------------------------------------------
if out=$(check --dashboard $DASH --rules $RULES --promtool-dir "$TMP/prom"); then
    echo "check.mjs: $out"
else
    echo "FAILED: check.mjs:"
    echo "$out"
    fail=1
fi
P="$TMP/prom"
cp $CHECK/alerts_test.yaml "$P/"
if out=$(promtool check rules "$P/rules.yaml" "$P/dashboard-rules.yaml" 2>&1); then
    echo "promtool check rules: $(grep -o 'SUCCESS: [0-9]* rules found' <<< "$out" | tr '\n' ' ')"
else
    echo "FAILED: promtool check rules:"
    echo "$out"
    fail=1
fi
if out=$(promtool test rules "$P/alerts_test.yaml" 2>&1); then
    echo "promtool test rules: $(grep -c 'alertname:' $CHECK/alerts_test.yaml) alert checks passed"
else
    echo "FAILED: promtool test rules:"
    echo "$out"
    fail=1
fi

# --- rendered with an overlay (the component needs kustomize components: kubectl 1.21+) --------------
kminor=$(kubectl version --client 2>/dev/null | sed -n 's/^Client Version: v1\.\([0-9]*\).*/\1/p' | head -n 1)
rendered=0
if [ -n "$kminor" ] && [ "$kminor" -ge 21 ]; then
    for o in cpu gpu; do
        d=build/monitoring-overlays/$o
        mkdir -p $d
        printf '%s\n' "# made by tests/integration/test_monitoring.sh: overlays/$o with the monitoring component" \
            "apiVersion: kustomize.config.k8s.io/v1beta1" "kind: Kustomization" "resources:" \
            "  - ../../../deploy/k8s/overlays/$o" "components:" "  - ../../../deploy/k8s/components/monitoring" > $d/kustomization.yaml
        if ! kubectl kustomize $d > "$TMP/$o.yaml" 2> "$TMP/$o.err"; then
            echo "FAILED: kubectl kustomize (overlays/$o + the component):"
            cat "$TMP/$o.err"
            fail=1
            continue
        fi
        if out=$(check --dashboard $DASH --rules $RULES --manifests "$TMP/$o.yaml" --builtin-out "$TMP/$o-builtin.yaml"); then
            echo "overlay $o + component: ${out##*; }"
        else
            echo "FAILED: overlay $o + component:"
            echo "$out"
            fail=1
        fi
        gpu=()
        [ $o = gpu ] && gpu=(--gpu rollout,trainer)
        if ! out=$(NODE_PATH=$PWD/build/deploy-check/node_modules node deploy/k8s/check/validate.js "${gpu[@]}" "$TMP/$o-builtin.yaml"); then
            echo "FAILED: overlay $o + component: validate.js:"
            echo "$out"
            fail=1
        fi
        rendered=$((rendered + 1))
    done
else
    echo "note: kubectl $(kubectl version --client 2>/dev/null | head -n 1) predates kustomize components (1.21): the component is not rendered"
fi

# --- broken variants must be refused -------------------------------------------------------------
nref=0
# refuse WHAT FILE(dashboard|rules|manifest) EXPECTED SED-EXPRESSION
refuse() {
    local what=$1 kind=$2 want=$3 expr=$4 src out
    case $kind in
        dashboard) src=$DASH ;;
        rules) src=$RULES ;;
        manifest) src=$TMP/cpu.yaml ;;
    esac
    local ext=${src##*.}
    sed "$expr" "$src" > "$TMP/bad.$ext"
    if cmp -s "$TMP/bad.$ext" "$src"; then
        echo "FAILED: mutation '$what' changed nothing"
        fail=1
        return
    fi
    nref=$((nref + 1))
    case $kind in
        dashboard) out=$(check --dashboard "$TMP/bad.$ext" --rules $RULES) ;;
        rules) out=$(check --dashboard $DASH --rules "$TMP/bad.$ext" --promtool-dir "$TMP/badprom") ;;
        manifest) out=$(check --dashboard $DASH --rules $RULES --manifests "$TMP/bad.$ext") ;;
    esac
    if [ $? = 0 ]; then
        echo "FAILED: broken $kind accepted: $what"
        fail=1
    elif ! grep -qF -- "$want" <<< "$out"; then
        echo "FAILED: $what: expected '$want' in:"
        echo "$out"
        fail=1
    fi
}
set +e
refuse "PromQL syntax (dashboard)" dashboard 'PromQL syntax error at column 13' 's/sum by (job) (up{/sum by (job (up{/'
refuse "an unknown metric (dashboard)" dashboard 'unknown metric marlaas_busy_fractoin' 's/marlaas_busy_fraction{/marlaas_busy_fractoin{/'
refuse "a duplicate panel id" dashboard 'duplicate panel id 1' '0,/"id": 2,/s//"id": 1,/'
refuse "overlapping panels" dashboard 'overlaps panel 2 "Targets up"' '0,/"x": 4,/s//"x": 2,/'
refuse "a panel outside the grid" dashboard 'outside the 24 columns' '0,/"w": 12,/s//"w": 30,/'
refuse "a panel without a datasource" dashboard 'datasource must be' '0,/"uid": "${datasource}"/s//"uid": "prom"/'
refuse "an undefined variable" dashboard 'uses $namespce, which the dashboard does not define' 's/marlaas_busy_fraction{namespace=~\\"\$namespace/marlaas_busy_fraction{namespace=~\\"$namespce/'
refuse "rate() of a gauge" dashboard 'rate() of marlaas_trainer_job_step, a gauge' 's/deriv(marlaas_trainer_job_step/rate(marlaas_trainer_job_step/'
refuse "a label the metric lacks" dashboard 'marlaas_trainer_steps_per_second has no label job_id' \
    's/marlaas_trainer_steps_per_second{namespace=~\\"$namespace\\"}/marlaas_trainer_steps_per_second{namespace=~\\"$namespace\\", job_id=~\\"$job_id\\"}/'
refuse "a legend naming a label the series lack" dashboard 'legend {{pod}}' 's/"legendFormat": "{{job_id}}"/"legendFormat": "{{pod}}"/'
refuse "PromQL syntax (rules)" rules 'PromQL syntax error' 's/expr: marlaas_ready == 0/expr: marlaas_ready == == 0/'
if promtool check rules "$TMP/badprom/rules.yaml" > "$TMP/promtool.out" 2>&1; then
    echo "FAILED: promtool check rules accepted marlaas_ready == == 0"
    fail=1
fi
refuse "an unknown metric (rules)" rules 'unknown metric marlaas_redis_upp' 's/marlaas_redis_up == 0/marlaas_redis_upp == 0/'
refuse "an alert without for:" rules 'MarlaasTargetDown: no for: duration' '0,/          for: 3m/{/          for: 3m/d}'
refuse "an alert without a known severity" rules 'severity label must be one of' '0,/severity: critical/s//severity: urgent/'
refuse "an annotation naming a label the alert lacks" rules 'uses $labels.pod, which the alert' \
    's/summary: "job {{ $labels.job_id }} is running/summary: "job {{ $labels.pod }} is running/'
refuse "a misspelt rule field" rules 'unknown field spec.groups.rules.annotation (not in the operator' '0,/          annotations:/s//          annotation:/'
refuse "a job label naming no service" rules 'job="rollouts" names no service' 's/absent(up{job="rollout"})/absent(up{job="rollouts"})/'
if [ $rendered -gt 0 ]; then
    refuse "the PodMonitor on a port the pods lack" manifest "port htp: Deployment/" 's/^    port: http$/    port: htp/'
    refuse "the dashboard without the sidecar's label" manifest 'the sidecar looks for "1"' 's/grafana_dashboard: "1"/grafana_dashboard: "true"/'
    refuse "a job label from a label the pods lack" manifest 'jobLabel app: ' 's/jobLabel: app.kubernetes.io\/name/jobLabel: app/'
    refuse "a PodMonitor selecting Redis too" manifest 'expected exactly rollout, scheduler, trainer, verifier' 's/^      - trainer$/      - trainer\n      - redis/'
fi
# the alert unit tests have teeth: a stalled job noticed after 10 minutes instead of 15
sed 's/marlaas_scheduler_job_step offset 15m/marlaas_scheduler_job_step offset 10m/' $RULES > "$TMP/bad-window.yaml"
check --dashboard $DASH --rules "$TMP/bad-window.yaml" --promtool-dir "$TMP/badwin" > /dev/null
cp $CHECK/alerts_test.yaml "$TMP/badwin/"
nref=$((nref + 1))
if promtool test rules "$TMP/badwin/alerts_test.yaml" > "$TMP/badwin.out" 2>&1; then
    echo "FAILED: the alert unit tests passed with MarlaasJobStalled's window changed to 10 minutes"
    fail=1
elif ! grep -q 'alertname: MarlaasJobStalled' "$TMP/badwin.out"; then
    echo "FAILED: the alert unit tests failed, but not on MarlaasJobStalled:"
    cat "$TMP/badwin.out"
    fail=1
fi
set -e

[ $fail = 0 ] || exit 1
if [ $rendered = 0 ]; then
    echo "SKIP: dashboard, rules and alert tests passed, $nref broken variants refused; the component was not rendered: kubectl $kminor predates kustomize components (kubectl 1.21+)"
    exit 77
fi
echo "monitoring: dashboard and $(grep -c '^        - alert:' $RULES) alerts valid (check.mjs, promtool check/test rules), component rendered with overlays cpu and gpu, $nref broken variants refused"
