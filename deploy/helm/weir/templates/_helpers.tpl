{{/* Names ------------------------------------------------------------------------------------ */}}

{{- define "weir.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "weir.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "weir.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "weir.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "weir.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "weir.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Labels ----------------------------------------------------------------------------------- */}}

{{- define "weir.labels" -}}
helm.sh/chart: {{ include "weir.chart" . }}
{{ include "weir.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Every agent of the release: Services, the PodDisruptionBudget and the NetworkPolicy. */}}
{{- define "weir.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{/* Topology --------------------------------------------------------------------------------- */}}

{{/*
The Deployments to render, as JSON {"items": [{"suffix", "zone", "agentZone", "replicas"}]}:
one per entry of .Values.zones, or a single one without a zone.
*/}}
{{- define "weir.deployments" -}}
{{- $items := list -}}
{{- if .Values.zones -}}
{{- $seen := dict -}}
{{- range $zone := .Values.zones -}}
{{- if not (kindIs "map" $zone) -}}
{{- fail "zones: each entry is a map with at least `name` (the nodes' zone label value)" -}}
{{- end -}}
{{- $name := required "zones[].name is required (the value of the nodes' zone label)" $zone.name | toString -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "zones: name %q must be a lowercase DNS label (it names the zone's Deployment)" $name) -}}
{{- end -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "zones: zone %q is listed twice" $name) -}}
{{- end -}}
{{- $_ := set $seen $name true -}}
{{- $replicas := $.Values.replicaCount -}}
{{- if hasKey $zone "replicas" -}}
{{- $replicas = $zone.replicas -}}
{{- end -}}
{{- $items = append $items (dict "suffix" $name "zone" $name "agentZone" (default $name $zone.agentZone | toString) "replicas" (int $replicas)) -}}
{{- end -}}
{{- else -}}
{{- $items = append $items (dict "suffix" "" "zone" "" "agentZone" "" "replicas" (int .Values.replicaCount)) -}}
{{- end -}}
{{- toJson (dict "items" $items) -}}
{{- end -}}

{{/* Agents in the release, over every Deployment. */}}
{{- define "weir.totalReplicas" -}}
{{- $total := 0 -}}
{{- range (include "weir.deployments" . | fromJson).items -}}
{{- $total = add $total .replicas -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* "true" when the agents run as a cluster (--control-listen), else "". */}}
{{- define "weir.clusterEnabled" -}}
{{- $mode := toString .Values.cluster.enabled -}}
{{- $total := include "weir.totalReplicas" . | int -}}
{{- if eq $mode "true" -}}
true
{{- else if eq $mode "false" -}}
{{- if gt $total 1 -}}
{{- fail "cluster.enabled is false but the release has more than one agent: agents on the same buckets must run as a cluster" -}}
{{- end -}}
{{- else if eq $mode "auto" -}}
{{- if gt $total 1 -}}true{{- end -}}
{{- else -}}
{{- fail (printf "cluster.enabled must be auto, true or false, not %q" $mode) -}}
{{- end -}}
{{- end -}}

{{/* Checks of values that no template would otherwise catch. */}}
{{- define "weir.validate" -}}
{{- $config := .Values.config | default dict -}}
{{- $managed := dict "agent" (list "listen" "advertised_host" "node_id" "rack" "data_dir") "cluster" (list "control_listen") -}}
{{- range $section, $keys := $managed -}}
{{- $table := get $config $section | default dict -}}
{{- range $key := $keys -}}
{{- if hasKey $table $key -}}
{{- fail (printf "config.%s.%s is set by the chart (from listenHost, ports, zones, dataDir, cluster and the pod IP; values.yaml explains each): remove it from config" $section $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $storage := get $config "storage" | default dict -}}
{{- $total := include "weir.totalReplicas" . | int -}}
{{- if lt $total 1 -}}
{{- fail "the release needs at least one agent (replicaCount, zones[].replicas)" -}}
{{- end -}}
{{- if and (gt $total 1) (not (get $storage "ingest_buckets")) -}}
{{- fail "more than one agent needs shared buckets: set config.storage.ingest_buckets (agents on the default file:// bucket in their own emptyDir would be unrelated brokers)" -}}
{{- end -}}
{{- end -}}

{{/* TOML ------------------------------------------------------------------------------------- */}}

{{/*
A TOML key: bare when it can be, quoted otherwise (bucket URLs in storage.bucket_options).
*/}}
{{- define "weir.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{/*
A TOML value. Helm reads every number of a values file as a float64, so integral numbers are
written as integers (a usize setting refuses 2.0; a float setting accepts 2).
JSON strings are valid TOML basic strings.
*/}}
{{- define "weir.toml.value" -}}
{{- $v := . -}}
{{- if kindIs "string" $v -}}
{{- toJson $v -}}
{{- else if kindIs "bool" $v -}}
{{- ternary "true" "false" $v -}}
{{- else if or (kindIs "float64" $v) (kindIs "float32" $v) -}}
{{- if eq $v (floor $v) -}}{{- int64 $v -}}{{- else -}}{{- $v -}}{{- end -}}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) -}}
{{- $v -}}
{{- else if kindIs "slice" $v -}}
[{{- range $i, $e := $v -}}{{- if $i -}}, {{ end -}}{{- include "weir.toml.value" $e -}}{{- end -}}]
{{- else if kindIs "map" $v -}}
{{- if not $v -}}
{}
{{- else -}}
{ {{- range $i, $k := keys $v | sortAlpha -}}{{- if $i -}},{{- end }} {{ include "weir.toml.key" $k }} = {{ include "weir.toml.value" (index $v $k) -}}{{- end }} }
{{- end -}}
{{- else -}}
{{- fail (printf "config: cannot write %v (%s) as TOML" $v (kindOf $v)) -}}
{{- end -}}
{{- end -}}

{{/* The agent's config file: one [section] per top-level key of .Values.config. */}}
{{- define "weir.toml" -}}
{{- $config := .Values.config | default dict -}}
{{- range $section := keys $config | sortAlpha -}}
{{- $table := index $config $section -}}
{{- if not (kindIs "map" $table) -}}
{{- fail (printf "config.%s must be a table (a section of config/weir.toml)" $section) -}}
{{- end }}
[{{ include "weir.toml.key" $section }}]
{{- range $key := keys $table | sortAlpha }}
{{ include "weir.toml.key" $key }} = {{ include "weir.toml.value" (index $table $key) }}
{{- end }}
{{ end -}}
{{- end -}}
