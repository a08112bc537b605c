{{- define "vllm-autoheal.name" -}}vllm-autoheal{{- end -}}
{{- define "vllm-autoheal.fullname" -}}
{{- if contains "vllm-autoheal" .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-vllm-autoheal" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}
{{- /* Cluster-scoped objects (the ClusterRole, its binding, the admission policy): named with the release's
namespace too, so that two teams' installs of the same release name, each watching its own namespaces, do not
collide. */ -}}
{{- define "vllm-autoheal.clusterName" -}}
{{ printf "%s-%s" (include "vllm-autoheal.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" }}
{{- end -}}
{{- define "vllm-autoheal.labels" -}}
app.kubernetes.io/name: vllm-autoheal
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "vllm-autoheal.selector" -}}
app.kubernetes.io/name: vllm-autoheal
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "vllm-autoheal.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "vllm-autoheal.fullname" .) .Values.serviceAccount.name }}
{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}
{{/* By digest when one is given (what runs is then exactly what was reviewed), else by tag. */}}
{{- define "vllm-autoheal.image" -}}
{{- if .Values.image.digest -}}{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}{{- end -}}
{{- end -}}
{{/* The rules for namespaced objects: exactly what the operator calls (tests/test_chart.py checks). */}}
{{- define "vllm-autoheal.namespacedRules" -}}
- apiGroups: ["vllm.autoheal.dev"]
  resources: ["vllmservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["vllm.autoheal.dev"]
  resources: ["vllmservices/status"]
  verbs: ["patch"]
# the owner references of its objects block the service's deletion until they are gone: where the API
# server enforces it (OwnerReferencesPermissionEnforcement, OpenShift's default) that takes this
- apiGroups: ["vllm.autoheal.dev"]
  resources: ["vllmservices/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["services", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# spec.modelConfig.configMapRef, and the Hub token of spec.hfTokenSecretRef, for pre-flight
- apiGroups: [""]
  resources: [{{ if and .Values.hub.useSecretTokens (ne .Values.hub.endpoint "off") }}"configmaps", "secrets"{{ else }}"configmaps"{{ end }}]
  verbs: ["get"]
{{- if and (gt (int .Values.replicas) 1) .Values.watchNamespaces }}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end -}}
