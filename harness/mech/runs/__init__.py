"""The shared base runs of a hypothesis file and the interventions made from them: the runs held
per corruption with their metric per prompt (`cached`), the one way they are built within the
memory budget (`build`), reference means (`reference`, `jackknife`), batched ablations
(`ablation`) and how much an intervention changed what is read (`change`)."""
