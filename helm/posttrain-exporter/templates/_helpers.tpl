{{/*
Every template below takes a dict context, so that it works both inside this chart and from a parent chart
that depends on it (your training chart):

  root    the caller's top-level context ($), required
  values  the chart's values; default: root.Values["posttrain-exporter"] when called from a parent chart
          (Helm merges this chart's defaults there), else root.Values
  run     the `run` label (sidecar only); default: sidecar.run, else the Job's name
*/}}

{{/* The chart's object names: <release>-posttrain-exporter, or the release name when it holds the name. */}}
{{- define "posttrain-exporter.fullname" -}}
{{- $v := get . "values" | default (index .root.Values "posttrain-exporter") | default .root.Values -}}
{{- if $v.fullnameOverride -}}
{{- $v.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := $v.nameOverride | default "posttrain-exporter" -}}
{{- if contains $name .root.Release.Name -}}
{{- .root.Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .root.Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of the chart's own objects. */}}
{{- define "posttrain-exporter.labels" -}}
app.kubernetes.io/name: posttrain-exporter
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/*
The labels the PodMonitor selects the training pods by (values.podLabels, default
posttrain-exporter/scrape: "true"). Put them in your pod template's metadata.labels:
  {{- include "posttrain-exporter.podLabels" (dict "root" $) | nindent 8 }}
*/}}
{{- define "posttrain-exporter.podLabels" -}}
{{- $v := get . "values" | default (index .root.Values "posttrain-exporter") | default .root.Values -}}
{{- toYaml $v.podLabels -}}
{{- end -}}

{{/*
The pod volumes the sidecar needs: `posttrain-logs` (an emptyDir the trainer writes its log into; mount it
in the trainer at sidecar.logsMountPath) and the exporter's config. In your pod spec's volumes:
  {{- include "posttrain-exporter.volumes" (dict "root" $) | nindent 8 }}
*/}}
{{- define "posttrain-exporter.volumes" -}}
- name: posttrain-logs
  emptyDir: {}
- name: posttrain-exporter-config
  configMap:
    name: {{ include "posttrain-exporter.fullname" . }}
{{- $v := get . "values" | default (index .root.Values "posttrain-exporter") | default .root.Values -}}
{{- with $v.sidecar.webConfig }}{{ if .secretName }}
- name: posttrain-exporter-web
  secret:
    secretName: {{ .secretName }}
{{- end }}{{ end }}
{{- if $v.earlyStop.action }}
- name: posttrain-stop
  emptyDir: {}
{{- end }}
{{- end -}}

{{/*
Whether the pod must set shareProcessNamespace: true: "true" or "false". The fallback sidecar watches the trainer's
processes to end with it, and earlyStop.action=signal finds the trainer's processes to signal them. In your pod spec:
  {{- if eq (include "posttrain-exporter.sharesProcesses" (dict "root" $)) "true" }}
  shareProcessNamespace: true
  {{- end }}
and pass "shareProcessNamespace" true to the sidecar template, which refuses earlyStop.action=signal without it.
*/}}
{{- define "posttrain-exporter.sharesProcesses" -}}
{{- $v := get . "values" | default (index .root.Values "posttrain-exporter") | default .root.Values -}}
{{- $native := eq (include "posttrain-exporter.native" (dict "root" .root "values" $v)) "true" -}}
{{- or (not $native) (eq $v.earlyStop.action "signal") -}}
{{- end -}}

{{/*
A probe of values.sidecar, adapted to the web config: over HTTPS when it turns TLS on, a TCP check when it turns
basic auth on (an HTTP probe would get 401). Takes (dict "probe" <probe> "web" <sidecar.webConfig>).
*/}}
{{- define "posttrain-exporter.probe" -}}
{{- $p := deepCopy .probe -}}
{{- $w := .web | default dict -}}
{{- if and $w.secretName (hasKey $p "httpGet") -}}
{{- if $w.basicAuth -}}
{{- $_ := set $p "tcpSocket" (dict "port" $p.httpGet.port) -}}
{{- $_ := unset $p "httpGet" -}}
{{- else if $w.tls -}}
{{- $_ := set $p.httpGet "scheme" "HTTPS" -}}
{{- end -}}
{{- end -}}
{{- toYaml $p -}}
{{- end -}}

{{/*
Whether the sidecar is a native sidecar (an init container with restartPolicy: Always): "true" or "false".
sidecar.native unset (null, the default): chosen from the cluster's version, .Capabilities.KubeVersion (native
sidecars are beta and on by default from Kubernetes 1.29; `helm template` assumes its own default version
unless given --kube-version). true or false forces it; true on a cluster before 1.29 stops the render.
  {{- $native := eq (include "posttrain-exporter.native" (dict "root" $)) "true" }}
*/}}
{{- define "posttrain-exporter.native" -}}
{{- $v := get . "values" | default (index .root.Values "posttrain-exporter") | default .root.Values -}}
{{- $kube := .root.Capabilities.KubeVersion.Version -}}
{{- $supported := semverCompare ">=1.29.0-0" $kube -}}
{{- $forced := $v.sidecar.native -}}
{{- if kindIs "bool" $forced -}}
{{- if and $forced (not $supported) -}}
{{- fail (printf "sidecar.native=true needs Kubernetes 1.29 or later (native sidecar containers), but the cluster is %s: leave sidecar.native unset to get the regular-container fallback on this cluster (put the sidecar under containers and have the trainer touch sidecar.doneFile), or set sidecar.native=false" $kube) -}}
{{- end -}}
{{- $forced -}}
{{- else -}}
{{- $supported -}}
{{- end -}}
{{- end -}}

{{/* The service account of the training pods when the sidecar reads logs through the Kubernetes API. */}}
{{- define "posttrain-exporter.serviceAccountName" -}}
{{- $v := get . "values" | default (index .root.Values "posttrain-exporter") | default .root.Values -}}
{{- if $v.serviceAccount.create -}}
{{- $v.serviceAccount.name | default (include "posttrain-exporter.fullname" .) -}}
{{- else -}}
{{- $v.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/*
The sidecar container, one list item. A native sidecar (see posttrain-exporter.native) goes in the pod's
initContainers; the fallback in containers, and the trainer touches sidecar.doneFile when it exits (README.md).
Its port is named `metrics`. Besides root, values and run, the context may give, for this pod only:
  logSource  file (follow sidecar.logFile on the shared volume), kubernetes (follow the container
             sidecar.kubernetesLogs.container of this pod through the Kubernetes API) or none (no log, the
             run's label and GPU counters only: the ranks other than 0 of a multi-node run); default
             sidecar.logSource
  runLabel   the pod label the run name is read from (downward API) when no run is given; default
             sidecar.runLabel (job-name)
  shareProcessNamespace  true when the pod spec sets it: earlyStop.action=signal needs it to find the trainer
  initContainers:
    {{- include "posttrain-exporter.sidecar" (dict "root" $ "run" "grpo-7b") | nindent 8 }}
*/}}
{{- define "posttrain-exporter.sidecar" -}}
{{- $v := get . "values" | default (index .root.Values "posttrain-exporter") | default .root.Values -}}
{{- $s := $v.sidecar -}}
{{- $native := eq (include "posttrain-exporter.native" (dict "root" .root "values" $v)) "true" -}}
{{- $source := get . "logSource" | default $s.logSource | default "file" -}}
{{- if not (has $source (list "file" "kubernetes" "none")) -}}
{{- fail (printf "logSource: %q is not file, kubernetes or none" $source) -}}
{{- end -}}
{{- $runLabel := get . "runLabel" | default $s.runLabel | default "job-name" -}}
{{- $stop := $v.earlyStop -}}
{{- if and (eq $stop.action "signal") (ne $source "none") -}}
{{- if not (get . "shareProcessNamespace") -}}
{{- fail "earlyStop.action=signal: the sidecar signals the trainer in another container of the pod, so the pod must share its process namespace: set shareProcessNamespace: true in the pod spec (see the posttrain-exporter.sharesProcesses template) and pass (dict ... \"shareProcessNamespace\" true) to the sidecar template; or use earlyStop.action=file with the trainer's callback" -}}
{{- end -}}
{{- if not $stop.process -}}
{{- fail "earlyStop.action=signal: set earlyStop.process to a piece of the trainer's command line (e.g. verl.trainer.main_ppo, train.py), by which the sidecar finds the processes to signal" -}}
{{- end -}}
{{- end -}}
{{- $run := get . "run" | default $s.run | default "$(RUN_NAME)" -}}
{{- /* serve's own options only, after the subcommand: `serve` accepts --log.level and --log.format too */ -}}
{{- $args := list "serve" -}}
{{- if eq $source "file" -}}
{{- $args = concat $args (list "--log" $s.logFile) -}}
{{- else if eq $source "kubernetes" -}}
{{- $args = concat $args (list "--log" (printf "k8s://%s" $s.kubernetesLogs.container)) -}}
{{- end -}}
{{- /* none: no --log. `serve --run NAME` alone is a GPU-only sidecar: the run's series (posttrain_run_finished{run},
which the GPU board joins the pod's GPUs on) and its GPUs, and no records (no step, so no stall alert). */ -}}
{{- $args = concat $args (list "--run" $run "--config" "/etc/posttrain-exporter/config.yaml" "--listen-address" (printf "0.0.0.0:%d" (int $s.port))) -}}
{{- $web := $s.webConfig | default dict -}}
{{- if $web.secretName -}}
{{- $args = concat $args (list "--web.config.file" (printf "%s/%s" $web.mountPath $web.key)) -}}
{{- end -}}
{{- $args = concat $args $s.extraArgs -}}
- name: posttrain-exporter
  image: {{ printf "%s:%s" $v.image.repository $v.image.tag | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if $native }}
  restartPolicy: Always
  {{- else }}
  # Fallback (not a native sidecar): run the exporter until the trainer has ended, give Prometheus
  # DONE_GRACE_SECONDS for a last scrape, then stop it so that the pod, and the Job, can complete. The trainer
  # has ended when it touched DONE_FILE, or, with shareProcessNamespace: true, when its processes are gone
  # however it ended (killed, out of memory): the main processes of the pod's other containers (parent 0: started
  # from outside the pod's namespace; not the pause process, PID 1, nor this wrapper), or only those whose command
  # line holds TRAINER_PROCESS when it is set, seen once and then gone for DONE_GRACE_SECONDS.
  command:
    - sh
    - -c
    - |
      posttrain-exporter "$@" & pid=$!
      trap 'kill -TERM "$pid" 2>/dev/null' TERM INT
      trainer() {
        for d in /proc/[0-9]*; do
          p=${d#/proc/}
          if [ "$p" = 1 ] || [ "$p" = "$$" ]; then continue; fi
          s=$(cat "$d/stat" 2>/dev/null) || continue
          set -- ${s##*) }
          [ "$2" = 0 ] || continue
          if [ -n "$TRAINER_PROCESS" ]; then
            c=$(tr '\000' ' ' < "$d/cmdline" 2>/dev/null) || continue
            case "$c" in *"$TRAINER_PROCESS"*) ;; *) continue ;; esac
          fi
          return 0
        done
        return 1
      }
      seen=0 gone=0
      while [ ! -e "$DONE_FILE" ]; do
        if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; exit $?; fi
        if trainer; then seen=1 gone=0; elif [ "$seen" = 1 ]; then gone=$((gone + 2)); fi
        if [ "$gone" -gt "$DONE_GRACE_SECONDS" ]; then
          echo "posttrain-exporter sidecar: the trainer's processes are gone; stopping" >&2
          break
        fi
        sleep 2
      done
      [ "$gone" -gt "$DONE_GRACE_SECONDS" ] || sleep "$DONE_GRACE_SECONDS"
      kill -TERM "$pid" 2>/dev/null
      wait "$pid"
    - posttrain-exporter
  {{- end }}
  args:
    {{- toYaml $args | nindent 4 }}
  {{- if or (eq $run "$(RUN_NAME)") (not $native) (eq $source "kubernetes") $s.extraEnv }}
  env:
    {{- if eq $run "$(RUN_NAME)" }}
    # The run's name: the pod label {{ $runLabel }}, set by the operator on every pod of the run.
    - name: RUN_NAME
      valueFrom:
        fieldRef:
          fieldPath: {{ printf "metadata.labels['%s']" $runLabel }}
    {{- end }}
    {{- if eq $source "kubernetes" }}
    # k8s://CONTAINER: the pod whose container log the sidecar follows is its own.
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    {{- end }}
    {{- if not $native }}
    - name: DONE_FILE
      value: {{ $s.doneFile | quote }}
    - name: DONE_GRACE_SECONDS
      value: {{ $s.doneGraceSeconds | int | quote }}
    - name: TRAINER_PROCESS
      value: {{ $s.trainerProcess | default "" | quote }}
    {{- end }}
    {{- with $s.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  ports:
    - name: metrics
      containerPort: {{ $s.port }}
      protocol: TCP
  {{- with $s.startupProbe }}
  startupProbe:
    {{- include "posttrain-exporter.probe" (dict "probe" . "web" $web) | nindent 4 }}
  {{- end }}
  {{- with $s.livenessProbe }}
  livenessProbe:
    {{- include "posttrain-exporter.probe" (dict "probe" . "web" $web) | nindent 4 }}
  {{- end }}
  {{- with $s.readinessProbe }}
  readinessProbe:
    {{- include "posttrain-exporter.probe" (dict "probe" . "web" $web) | nindent 4 }}
  {{- end }}
  {{- with $s.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $s.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: posttrain-logs
      mountPath: {{ $s.logsMountPath }}
      readOnly: true
    - name: posttrain-exporter-config
      mountPath: /etc/posttrain-exporter
      readOnly: true
    {{- if $web.secretName }}
    - name: posttrain-exporter-web
      mountPath: {{ $web.mountPath }}
      readOnly: true
    {{- end }}
    {{- if $stop.action }}
    # earlyStop: the stop file (and the record of a stop by signals, so that a restarted sidecar stops no run twice)
    - name: posttrain-stop
      mountPath: {{ $stop.mountPath }}
    {{- end }}
    {{- with $s.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
