{{/* Names. */}}
{{- define "orchard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "orchard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "orchard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "orchard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels every object of the release carries. */}}
{{- define "orchard.labels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "orchard.baseLabels" . }}
{{- end }}

{{/* The labels of orchard.labels but the instance, which selectors hold. */}}
{{- define "orchard.baseLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: orchard
{{- end }}

{{/*
The server's pods. app.kubernetes.io/name=orchard-server is what the
runtime's orchard-agent-access policy admits (kube.Config.ServerPods):
it must not change.
*/}}
{{- define "orchard.serverSelector" -}}
app.kubernetes.io/name: orchard-server
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "orchard.redisSelector" -}}
app.kubernetes.io/name: orchard-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* An image of .Values.image: a name under the registry, or a whole reference (with a "/"). */}}
{{- define "orchard.image" -}}
{{- $ref := index .root.Values.image .name -}}
{{- if contains "/" $ref -}}
{{- $ref -}}
{{- else if $ref -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .root.Values.image.registry) $ref (default .root.Chart.AppVersion .root.Values.image.tag) -}}
{{- end -}}
{{- end }}

{{/* Whether the server uses a Redis store, and which URL. */}}
{{- define "orchard.redisURL" -}}
{{- if .Values.redis.external.url -}}
{{- .Values.redis.external.url -}}
{{- else if .Values.redis.enabled -}}
{{- printf "redis://%s-redis.%s.svc:6379/0" (include "orchard.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end }}

{{- define "orchard.replicas" -}}
{{- $redis := include "orchard.redisURL" . -}}
{{- $n := int (default (ternary 2 1 (ne $redis "")) .Values.replicaCount) -}}
{{- if and (gt $n 1) (eq $redis "") -}}
{{- fail "replicaCount > 1 needs a Redis store (redis.enabled or redis.external.url): the memory store is one replica's own" -}}
{{- end -}}
{{- $n -}}
{{- end }}

{{- define "orchard.apiKeySecret" -}}
{{- default (printf "%s-api-keys" (include "orchard.fullname" .)) .Values.auth.existingSecret -}}
{{- end }}

{{- define "orchard.redisSecret" -}}
{{- default (printf "%s-redis" (include "orchard.fullname" .)) .Values.redis.external.existingSecret -}}
{{- end }}

{{/* ORCHARD_KUBE_TOLERATIONS: key[=value]:Effect,... */}}
{{- define "orchard.tolerations" -}}
{{- $out := list -}}
{{- range .Values.sandbox.tolerations -}}
{{- if not (and .key .effect) -}}
{{- fail "sandbox.tolerations: each needs a key and an effect (NoSchedule, PreferNoSchedule, NoExecute)" -}}
{{- end -}}
{{- if .value -}}
{{- $out = append $out (printf "%s=%s:%s" .key .value .effect) -}}
{{- else -}}
{{- $out = append $out (printf "%s:%s" .key .effect) -}}
{{- end -}}
{{- end -}}
{{- join "," $out -}}
{{- end }}

{{/* ORCHARD_KUBE_NODE_SELECTOR: k=v,... in key order, so a re-render changes nothing. */}}
{{- define "orchard.nodeSelector" -}}
{{- $out := list -}}
{{- range $k, $v := .Values.sandbox.nodeSelector -}}
{{- $out = append $out (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $out -}}
{{- end }}
